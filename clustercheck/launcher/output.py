"""A node's streamed torchrun output as lines prefixed with `node/rank` (pure logic, no I/O).

torchrun's `--tee` marks every line a rank writes with `[ROLE LOCAL_RANK]:` (`[default0]:hello`); that mark
becomes `node2/3: hello` with the global rank (node2/local0 in an elastic run, where the rendezvous gives out
global ranks), and torchrun's own lines become `node2: ...`.
"""

from __future__ import annotations

from collections import deque

from clustercheck.stages.rootcause import TEE_MARK

TAIL_LINES = 8
RECENT_LINES = 1000  # raw lines kept for finding the failing rank's own error (rootcause.node_failure)


def prefixed(node: str, line: str, first_rank: int | None) -> str:
    mark = TEE_MARK.match(line)
    if not mark:
        return f"{node}: {line}"
    local = int(mark.group(1))
    rank = f"local{local}" if first_rank is None else str(first_rank + local)
    return f"{node}/{rank}: {line[mark.end() :]}"


class NodeOutput:
    """One node's stdout and stderr, fed in chunks as they arrive; complete lines come out prefixed. The last
    few meaningful lines are kept for the failure message, and the last raw lines (as torchrun wrote them) for
    finding the failing rank's own error."""

    def __init__(self, node: str, first_rank: int | None) -> None:
        self.node = node
        self.first_rank = first_rank
        self._partial = {"stdout": "", "stderr": ""}
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)
        self.recent: deque[str] = deque(maxlen=RECENT_LINES)

    def feed(self, stream: str, text: str) -> list[str]:
        pending = self._partial.get(stream, "") + text.replace("\r\n", "\n")
        *lines, self._partial[stream] = pending.split("\n")
        return [self._line(line) for line in lines]

    def flush(self) -> list[str]:
        lines = [self._line(rest) for rest in self._partial.values() if rest]
        self._partial = {"stdout": "", "stderr": ""}
        return lines

    def _line(self, line: str) -> str:
        self.recent.append(line.rstrip("\r"))
        out = prefixed(self.node, line.rstrip("\r"), self.first_rank)
        if line.strip(" =-*"):
            self.tail.append(out)
        return out
