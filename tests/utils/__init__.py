"""Shared helpers for tests that start real processes.

- processes.py: free ports, spawning helper processes, stopping a process tree by pid, leak detection
"""
