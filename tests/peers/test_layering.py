import subprocess
import sys


def test_peers_imports_no_networking_and_nothing_from_swarm():
    code = ("import sys, peers, peers.checkpoint, peers.train; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('hivemind', 'libp2p', 'msgpack', 'swarm')]; "
            "print(','.join(bad))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == ""
