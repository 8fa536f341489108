"""Mending a stage group whose copies drifted apart: the strays of a round take the holders' state.

Once a round's lineages show strays (`swarm.stage_group.lineage.judge`), every member knows who they are, and after
the round's step the holders equip each stray as they equip a joiner (`swarm.stage_group.state_transfer`): the first
two send the whole state, the others vouch for its digest, and the stray loads a state that two holders agree on
(one where only one holds it). A stray whose state does not come in time keeps its own, and its lineage stays
apart, so the next round finds it again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection

from peers.worker import StageWorker, WorkerError
from swarm.events import event
from swarm.net.delivery import Inbound, Send
from swarm.stage_group.lineage import Verdict
from swarm.stage_group.state_transfer import load_state, receive_agreed_state, send_digest, send_state

logger = logging.getLogger(__name__)


def mend(*, me: str, worker: StageWorker, verdict: Verdict, run_id: str, iteration: int, epoch: int, send: Send,
         receive: Callable[[float], list[Inbound]], timeout: float,
         expect: Callable[[Collection[str]], None] | None = None, voices: int = 2,
         progress: Callable[[], int] | None = None) -> bool | None:
    """This member's part in mending its group after the step of `iteration`'s round.

    :param send: the transport's send (STATE messages); a holder's sends are not waited for
    :param receive: this iteration's STATE messages, waiting up to the timeout for the first
    :param timeout: seconds a stray waits for a state enough holders agree on
    :param expect: told the holders before a stray waits (the transport takes stage state only from peers named)
    :param voices: holders whose digests must agree (fewer where fewer hold the group's lineage)
    :param progress: state bytes received so far, pieces included: the wait lasts `timeout` past the last of them
    :returns: None for a member with nothing to take (a holder, or no strays), True for a stray that loaded the
      holders' state, False for one whose state did not come or did not fit (it keeps its own)
    """
    if me in verdict.holders:
        senders = verdict.holders[:voices]
        for stray in verdict.strays:
            if me in senders:
                send_state(me=me, worker=worker, to=stray, run_id=run_id, iteration=iteration, epoch=epoch,
                           send=send)
            else:
                send_digest(me=me, worker=worker, to=stray, run_id=run_id, iteration=iteration, epoch=epoch,
                            send=send)
            logger.info("stage %d copy of %s went another way by iteration %d: %s it", worker.stage, stray,
                        iteration, "sent our state to" if me in senders else "vouched for our state to",
                        extra=event("state_sent", stage=worker.stage, to=stray, why="mending"))
        return None
    if me not in verdict.strays:
        return None
    needed = min(voices, len(verdict.holders))

    def electorate() -> tuple[Collection[str], int]:  # the transport takes their state while this one waits
        if expect is not None:
            expect(verdict.holders)
        return verdict.holders, needed

    try:
        steps = load_state(worker, receive_agreed_state(worker, receive, senders=verdict.holders, needed=needed,
                                                        timeout=timeout, electorate=electorate, progress=progress))
    except (TimeoutError, WorkerError) as e:
        logger.warning("stage %d: this copy went another way than %s's and their state did not come: %s",
                       worker.stage, ", ".join(verdict.holders), e,
                       extra=event("stage_mended", stage=worker.stage, iteration=iteration, loaded=False,
                                   holders=list(verdict.holders)))
        return False
    logger.warning("stage %d: this copy went another way than %s's; loaded their state (step %d)", worker.stage,
                   ", ".join(verdict.holders), steps,
                   extra=event("stage_mended", stage=worker.stage, iteration=iteration, loaded=True,
                               holders=list(verdict.holders)))
    return True
