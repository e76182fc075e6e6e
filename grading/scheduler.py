"""How a class's checks go to xdist workers: loadgroup, with timing spread out and a slow track shared.

xdist's loadgroup gives each group, here a submission's track (grading/tracks.py), whole to one worker, in
collection order. In a class of real repos on one GPU, a worker per core, two things went wrong
(notes/grading-speed.md, "timing windows pause the others; timing spread and slow tracks shared"):

- One slow track held up the class. A Triton kernel that autotunes on every shape, or a
  torch.compile'd PyTorch slot, ran for many minutes on one worker while the others sat idle after
  their last track (issue 32). Here, once no track is left to hand out, an idle worker
  takes the later half of the checks still queued for the track that proves slowest (the mean
  duration of its completed checks times the checks still queued), when that is at least
  STEAL_MIN_S. The thief starts a runner of its own for the track (seconds of a core, plus the
  kernels it compiles): results stay right, since every worker computes the replies it lacks, but
  a track must prove slow before it is split, and what is left must be worth the start.
- Timing tracks (one check each, a few seconds of which hold the GPU alone) went out last, and
  queued behind each other. Here they are spread through the queue, and at most TIMING_PER_GPU are
  in progress on one GPU at a time.
- A submission whose Triton slot is slow at every case began its Triton tracks in the queue's
  second half all the same, and its minute-long cases (a torch.compile over Python loops of tiles,
  which dynamo unrolls for each shape; a forward and backward timed out at 300 s each) ended a class
  minutes after the rest (notes/grading-speed.md, "the tail, check by check"). Here a Triton check
  still running PROMOTE_S after it started marks its submission slow, and the submission's queued
  Triton tracks go to the head of the queue, in their order. Only the Triton slot's checks count:
  a torch.compile'd PyTorch slot takes a minute at its first case on the CPU in half the class, and
  every Triton track first, tried, made every submission compile at once and ended the class later
  ("Triton first"). A promoted track is not split earlier: split parts compile again.
- Promoted, the tracks of a slow submission still ran their kernels' compiles one after another, and
  waited out a timeout on their first 1024-long case only after all the smaller ones. Its tracks are
  now split (_split_slow): its cases from the handout's size on into a part of their own, and, once
  a case of that size answered in time, its kernels into a part each, which idle workers compile
  side by side.
- A Triton slot that autotunes (every new length times each config again) may never run a check
  for PROMOTE_S before its tracks' turn, and the part of its largest kernel, whose compile is the
  longest, then ended the class: kbjiang's fp32 d128 part compiled for most of the flash timeout,
  beginning only after its tracks' turn and their promotion, and ended minutes after the rest
  (notes/grading-speed.md, "the timing fix on a GPU"). Its runner's facts tell
  the scheduler once it autotuned (autotuned: after its memory check, the first track of all), and
  the part of each queued Triton track's largest kernel goes to the head of the queue then; the rest
  of its tracks keep their place. All of such a slot's tracks moved up, whole or in halves, made the
  light submissions wait and ended the class later (notes/grading-speed.md, "an autotuning Triton
  slot moved up"). Measured: notes/grading-speed.md, "largest kernels first".
- What goes to the head of the queue (a promotion, an autotuner's largest kernels, a slow track's
  parts) goes behind what went there before it and is still queued (_to_head): a long part moved
  first is never overtaken by a submission proven slow later.

The worker side is xdist's own (xdist/remote.py): a worker runs its tests in the order it got them,
and holds the next one back until it has another or a shutdown. So a worker is idle with fewer than
2 tests queued, the first 2 of a worker's queue are never stolen, and an idle worker that has a test
and finds nothing worth stealing is shut down, or its last test would never run. A worker that was
never given a test holds none back: it waits, free, for a track to prove slow.

A worker gets its next unit only when it is about to be idle (one test left, the one it holds back),
not while it still runs one (loadscope's mark, two left): a unit bound behind a long check waits for
it, and a slow submission's d128 part, bound to a worker that then ran a check of minutes, began
minutes after the others and ended the class (notes/grading-speed.md, "the class to its own end on
one H100"). Binding it late costs a message's round trip per unit.
"""
import time
from collections import Counter
from typing import NamedTuple

from xdist.remote import Producer
from xdist.scheduler import LoadGroupScheduling

from grading.matrix import GPU_MEMORY_CASE, flash_cases
from grading.tracks import KINDS, TRITON_CASES

TIMING_PER_GPU = 3  # timing tracks in progress at once on one GPU
STEAL_MIN_S = 30.0  # what a track's queued checks must be expected to take for an idle worker to share them
RUNNING = 2  # the tests at the head of a worker's queue: the one it runs and the one it holds next
# A check still running after this share of the flash timeout is likely to time out, and is taken
# as timed out already for what may be shared (timed_out): its runner will fail the track's larger
# cases at once, where a thief's runner would wait out a timeout of its own for each. cherryni2022's
# 1024-long cases, each waiting out the flash timeout, were stolen while its first one still ran, and
# every thief timed out again, past the class's end (notes/grading-speed.md, "the tail, check by check").
LIKELY_TIMEOUT = 2 / 3
# The handout's smallest case on a GPU (grading/matrix.py): the sizes at which a slow class's calls time out.
LARGE = min(case.work for tier, case in flash_cases("triton", on_gpu=True) if tier == "handout")
PROMOTE_S = 60.0  # a Triton check running this long marks its submission's Triton slot slow: well past
# what a correct kernel's memory check at 16384 takes, compiling included, in a class on one GPU


class Steal(NamedTuple):
    track: str
    victim: str  # the workers' ids, "gw3"
    thief: str
    count: int
    seconds: float  # the estimate of the victim's queued checks of the track, before the steal

    def line(self) -> str:
        return (f"spread {self.track}: {self.count} of its checks from {self.victim} to {self.thief} "
                f"(about {self.seconds:.0f} s left)")


class Request(NamedTuple):
    """A steal in flight: the victim answers with the tests it removed from its queue. With no
    thief it is a split: the tests go to the head of the queue, a part per kernel."""
    victim: object
    thief: object | None
    key: tuple
    seconds: float
    groups: tuple = ()  # a split's: the tests of each part


class GradingScheduling(LoadGroupScheduling):
    """loadgroup's queue and work units, keyed (track, part): part 0 is the track as collected, each
    steal makes a new part, so a worker may hold two parts of one track and every unit keeps its own
    tests, in the order they were sent (loadscope.remove_node takes the first undone one for the crash)."""

    def __init__(self, config, log: Producer | None = None, gpus: int = 1, timing_per_gpu: int | None = None,
                 steal_min_s: float | None = None, on_steal=None, identities: dict | None = None,
                 promote_after_s: float | None = None, on_promote=None, clock=time.monotonic,
                 flash_timeout_s: float | None = None):
        super().__init__(config, log)
        self.log = log.gradingsched if log is not None else Producer("gradingsched")
        self.gpus = max(1, gpus)
        # Read here, not as defaults: a test session's plugin may change them.
        self.timing_per_gpu = TIMING_PER_GPU if timing_per_gpu is None else timing_per_gpu
        self.steal_min_s = STEAL_MIN_S if steal_min_s is None else steal_min_s
        self.smaller_than = {}  # track -> only cases smaller than this may be shared (timed_out)
        self.completed = {}  # track -> [seconds, count] of its completed tests
        self.parts = Counter()  # track -> parts made by steals
        self.requests = {}  # victim -> the Request in flight to it: one steal by a thief at most, any splits
        self.steals = []  # Steal, one per steal that moved tests
        self.on_steal = on_steal  # called with each Steal as it happens (the plugin prints it)
        self.position = {}  # nodeid -> its index in the collection (every worker's, checked identical)
        # node id -> grading.check.CheckIdentity, filled by the controller as the workers' collections
        # come in (ControllerPlugin.pytest_xdist_node_collection_finished); none for other tests.
        self.identities = identities if identities is not None else {}
        self.timing_tracks = set()  # the submissions' timing tracks, known once the collection is
        self.promote_after_s = PROMOTE_S if promote_after_s is None else promote_after_s
        self.on_promote = on_promote  # called with a line for each promotion (the plugin prints it)
        self.clock = clock
        # the rubric's flash timeout (the controller passes it); without it no running check counts as timed out
        self.likely_timeout_s = LIKELY_TIMEOUT * flash_timeout_s if flash_timeout_s else float("inf")
        self.in_flight = {}  # nodeid -> when a worker began it (the controller's pytest_runtest_logstart)
        self.slow = set()  # submissions a Triton check has proved slow: moved up once
        self.promotions = []  # the line of each move or split, saying why
        self.proven = {}  # submission -> the largest case its Triton slot answered in time (answered)
        self.fronted = set()  # submissions whose Triton slot autotunes: their largest kernels sent first, once
        self.moved_up = set()  # units moved to the head of the queue (_to_head): later moves queue behind them

    def shared_call(self, nodeid: str) -> str:
        """What a test shares a runner call with (CheckIdentity.shared_call); a test of no identity
        shares nothing."""
        identity = self.identities.get(nodeid)
        return identity.shared_call if identity is not None else nodeid

    def case_size(self, nodeid: str) -> int | None:
        identity = self.identities.get(nodeid)
        return identity.case_size if identity is not None else None

    def _split_scope(self, nodeid: str) -> str:
        """A test's xdist group: its submission's track; loadgroup's reading of the id for any other test."""
        identity = self.identities.get(nodeid)
        return identity.submission_track if identity is not None else super()._split_scope(nodeid)

    def is_timing(self, track: str) -> bool:
        return track in self.timing_tracks

    def timed_out(self, nodeid: str) -> None:
        """A check timed out: its runner now fails every case at least as large at once
        (SubmissionRunner.call), which a thief's fresh runner would not know, and would wait out
        the timeout again. So from now on only its track's smaller cases may be shared."""
        identity = self.identities.get(nodeid)
        if identity is None:
            return
        track, size = identity.submission_track, identity.case_size
        self.smaller_than[track] = min(size, self.smaller_than.get(track, size)) if size else 0

    def share_limit(self, track: str) -> int | None:
        """Only the track's cases smaller than this may be shared (None: any): the smallest that
        timed out, or that has run for longer than likely_timeout_s and still runs."""
        sizes = [self.smaller_than[track]] if track in self.smaller_than else []
        now = self.clock()
        for nodeid, began in self.in_flight.items():
            identity = self.identities.get(nodeid)
            if identity is not None and identity.submission_track == track and now - began >= self.likely_timeout_s:
                sizes.append(identity.case_size or 0)
        return min(sizes) if sizes else None

    @property
    def tests_finished(self) -> bool:
        return super().tests_finished and not self.requests

    # -- handing out tracks ------------------------------------------------------------------
    def schedule(self) -> None:
        assert self.collection_is_completed
        if self.collection is not None:  # a worker added later (a crashed one's replacement)
            for node in self.nodes:
                self._reschedule(node)
            return
        if not self._check_nodes_have_same_collection():
            self.log("**Different tests collected, aborting run**")
            return
        self.collection = list(next(iter(self.registered_collections.values())))
        if not self.collection:
            return
        self.position = {nodeid: index for index, nodeid in enumerate(self.collection)}
        self.timing_tracks = {identity.submission_track for identity in self.identities.values()
                              if identity.track.timing}
        units = {}
        for nodeid in self.collection:
            units.setdefault((self._split_scope(nodeid), 0), {})[nodeid] = False
        for key in spread_timing(list(units), self.is_timing):
            self.workqueue[key] = units[key]
        # Unlike loadscope, workers left without a track stay up: they hold no test back, and may
        # take part of a track that proves slow.
        for node in self.nodes:
            if self.workqueue:
                self._assign_work_unit(node)
        for node in self.nodes:
            self._reschedule(node)

    def _reschedule(self, node) -> None:
        if not self.workqueue:  # any completion may show a track to be slow: idle workers look again
            self._share_the_rest()
        elif not node.shutting_down and self._pending_of(self.assigned_work[node]) < RUNNING:
            self._assign_work_unit(node)

    def _assign_work_unit(self, node) -> None:
        key = self._next_unit(node)
        unit = self.workqueue.pop(key)
        self.assigned_work[node][key] = unit
        node.send_runtest_some([self.position[nodeid] for nodeid, done in unit.items() if not done])

    def _next_unit(self, node):
        """The queue's first unit, unless it is a timing track and the node's GPU has its fill of
        them: then the first that is not, if any is left."""
        first = next(iter(self.workqueue))
        if not self.is_timing(first[0]) or self._timing_in_progress(self.gpu_of(node)) < self.timing_per_gpu:
            return first
        return next((key for key in self.workqueue if not self.is_timing(key[0])), first)

    def gpu_of(self, node) -> int:
        """The GPU of a worker: session.WorkerState.worker_gpu pins workers round-robin by their number."""
        number = node.gateway.id.removeprefix("gw")
        return int(number) % self.gpus if number.isdigit() else 0

    def _timing_in_progress(self, gpu: int) -> int:
        return sum(1 for node, units in self.assigned_work.items() if self.gpu_of(node) == gpu
                   for key, unit in units.items() if self.is_timing(key[0]) and not all(unit.values()))

    def mark_test_complete(self, node, item_index: int, duration: float = 0) -> None:
        nodeid = self.registered_collections[node][item_index]
        units = self.assigned_work[node].values()
        unit = next((u for u in units if u.get(nodeid) is False), None) or next(u for u in units if nodeid in u)
        unit[nodeid] = True
        seconds = self.completed.setdefault(self._split_scope(nodeid), [0.0, 0])
        seconds[0] += duration
        seconds[1] += 1
        self.in_flight.pop(nodeid, None)
        self._promote_slow()
        identity = self.identities.get(nodeid)
        if identity is not None and identity.submission in self.slow:
            self._split_slow(identity.submission)
        self._reschedule(node)

    def remove_node(self, node):
        self.requests.pop(node, None)  # a dead worker answers nothing
        for unit in self.assigned_work.get(node, {}).values():  # its running test runs no longer
            for nodeid in unit:
                self.in_flight.pop(nodeid, None)
        return super().remove_node(node)  # a crashed worker's undone units go back to the queue

    # -- promoting a slow submission's Triton tracks -----------------------------------------
    def started(self, nodeid: str) -> None:
        """A worker began a test (xdist's logstart, which the controller passes on)."""
        self.in_flight[nodeid] = self.clock()
        self._promote_slow()

    def _promote_slow(self) -> None:
        now = self.clock()
        for nodeid, began in list(self.in_flight.items()):
            identity = self.identities.get(nodeid)
            if identity is None or now - began < self.promote_after_s or identity.submission in self.slow:
                continue
            if identity.track.kind not in TRITON_CASES:
                continue
            self.slow.add(identity.submission)
            moved = [key for key, unit in self.workqueue.items() if self._is_triton_of(unit, identity.submission)]
            if not moved:  # all of them handed out already
                self._split_slow(identity.submission)
                continue
            self._to_head(moved)
            line = (f"{identity.submission}: {len(moved)} Triton track(s) moved to the head of the queue, since "
                    f"{nodeid.split('::')[-1].split('@')[0]} had run {now - began:.0f} s")
            self._say(line)
            self._split_slow(identity.submission)

    def _to_head(self, keys: list) -> None:
        """Move queued units to the head of the queue, in their order, behind those moved there before
        them that are still queued: a later move never overtakes an earlier one. cherryni2022's last
        1024 part, which waits out a flash timeout, went behind the tracks and parts of a submission
        promoted a second later, began minutes after its other parts and ended the class
        (notes/grading-speed.md, "largest kernels first")."""
        moving = set(keys)
        ahead = [key for key in self.workqueue if key in self.moved_up and key not in moving]
        rest = [key for key in self.workqueue if key not in self.moved_up and key not in moving]
        for key in [*ahead, *keys, *rest]:
            self.workqueue.move_to_end(key)
        self.moved_up.update(keys)

    def _say(self, line: str) -> None:
        self.promotions.append(line)
        self.log(line)
        if self.on_promote is not None:
            self.on_promote(line)

    def _is_triton_of(self, unit: dict, submission: str) -> bool:
        identity = self.identities.get(next(iter(unit), None))
        return identity is not None and identity.submission == submission and identity.track.kind is KINDS["triton"]

    # -- splitting a slow submission's Triton tracks by kernel -------------------------------
    def kernel(self, nodeid: str) -> str:
        identity = self.identities.get(nodeid)
        return identity.kernel if identity is not None else ""

    def answered(self, nodeid: str, seconds: float) -> None:
        """A check's call answered, right or wrong (no timeout, no cut, no crash), in `seconds`: the
        controller passes it on. A Triton case answered well inside the flash timeout shows that the
        submission's cases up to its size end in time, so a slow submission's cases that large may
        run in runners of their own without each waiting out a timeout (_split_slow)."""
        identity = self.identities.get(nodeid)
        if identity is None:
            return
        # The memory check's case is no parameter of it: the slot's own at N = 16384.
        size = GPU_MEMORY_CASE.work if identity.track.kind is KINDS["memory-triton"] else identity.case_size
        if identity.track.kind not in TRITON_CASES or not size:
            return
        if seconds < self.likely_timeout_s and identity.submission_track not in self.smaller_than:
            self.proven[identity.submission] = max(size, self.proven.get(identity.submission, 0))

    def _split_slow(self, submission: str) -> None:
        """A slow submission's Triton tracks, split (_parts_of): a track compiles its kernels one after
        another, and one whose every kernel compiled for a minute or two (large fp32 tiles autotuned
        over several configs) ended a class minutes after the rest while workers sat idle; another
        waited out a timeout on its first 1024-long case only after a minute or two of smaller ones
        (notes/grading-speed.md, "a slow submission's tracks split"). A queued track keeps its first
        kernel, its other parts go right after it; from a track a worker holds, the parts go to the
        head of the queue (a steal with no thief)."""
        proven = self.proven.get(submission, 0)
        for key in [key for key, unit in self.workqueue.items() if self._is_triton_of(unit, submission)]:
            self._split_queued(key, proven)
        for node, units in self.assigned_work.items():
            if node in self.requests:
                continue
            queued = [(key, nodeid) for key, unit in units.items() for nodeid, done in unit.items() if not done]
            queued = queued[RUNNING:]
            for key in dict.fromkeys(key for key, _ in queued):
                if not self._is_triton_of(units[key], submission):
                    continue
                if groups := self._parts_of(key[0], units[key], [nodeid for k, nodeid in queued if k == key], proven):
                    self.requests[node] = Request(node, None, key, 0.0, tuple(groups))
                    node.send_steal([self.position[nodeid] for group in groups for nodeid in group])
                    break

    def _parts_of(self, track: str, unit: dict, queued: list, proven: int) -> list:
        """The groups of a unit's `queued` tests that may run in runners of their own (none of them
        sharing a call with the unit's other tests, nor as large as a case of the track that timed out):
        - those no larger than `proven`, the largest case the submission answered in time (answered),
          one group per kernel that is not the unit's first nor one its other tests began, the
          kernel of the largest case first: its compile is likely the longest (a d128 kernel's, whose
          part, queued last, began minutes after the others: notes/grading-speed.md, "the whole
          class, to its end");
        - those larger, from the handout's size on (LARGE), as one group, smallest first, where
          smaller ones come before them: one runner waits out their timeout once and fails the
          larger ones at once, as the track's would, without first running all the smaller ones."""
        others = [nodeid for nodeid in unit if nodeid not in set(queued)]
        kernels = {self.kernel(nodeid) for nodeid in others} | {next(map(self.kernel, unit), "")}
        calls = {self.shared_call(nodeid) for nodeid in others}
        limit = self.share_limit(track)
        free = [nodeid for nodeid in queued if self.kernel(nodeid) and self.shared_call(nodeid) not in calls
                and (limit is None or (self.case_size(nodeid) or limit) < limit)]
        groups = by_kernel([nodeid for nodeid in free if self.case_size(nodeid) <= proven
                            and self.kernel(nodeid) not in kernels], self.kernel)
        groups.sort(key=lambda group: max(map(self.case_size, group)), reverse=True)  # stable: ties in order
        large = [nodeid for nodeid in free if proven < self.case_size(nodeid) and LARGE <= self.case_size(nodeid)]
        first = min(large, key=queued.index, default=None)
        before = queued[:queued.index(first)] if large else []
        if any(nodeid not in large and self.shared_call(nodeid) not in calls for nodeid in before):
            groups.append(sorted(large, key=self.case_size))  # stable: a case's checks stay in order
        return groups

    def autotuned(self, submission: str) -> None:
        """The submission's Triton slot autotuned (the controller hears it from the runner's facts,
        session.Grading.note_runner): from each of its queued Triton tracks, the part of its largest
        kernel (_parts_of: no larger than a case it answered in time) goes to the head of the queue."""
        if submission in self.fronted:
            return
        self.fronted.add(submission)
        proven = self.proven.get(submission, 0)
        fronted = []
        for key in [key for key, unit in self.workqueue.items() if self._is_triton_of(unit, submission)]:
            unit = self.workqueue[key]
            largest = self._parts_of(key[0], unit, list(unit), proven)[:1]
            if not largest or max(map(self.case_size, largest[0])) > proven:  # the large cases' group, untried
                continue
            for nodeid in largest[0]:
                del unit[nodeid]
            fronted += self._new_parts(key[0], largest)
        if not fronted:
            return
        self._to_head(fronted)
        self._say(f"{submission}: its Triton slot autotunes: its largest kernels to the head of the queue, "
                  f"{self._describe(fronted)}")

    def _split_queued(self, key, proven: int) -> None:
        unit = self.workqueue[key]
        groups = self._parts_of(key[0], unit, list(unit), proven)
        if not groups:
            return
        for nodeid in (nodeid for group in groups for nodeid in group):
            del unit[nodeid]
        parts = self._new_parts(key[0], groups)
        order = [k for k in self.workqueue if k not in parts]
        at = order.index(key) + 1
        for k in [*order[:at], *parts, *order[at:]]:  # the parts right after the track
            self.workqueue.move_to_end(k)
        if key in self.moved_up:  # and with it among the units moved to the head
            self.moved_up.update(parts)
        self._say(f"{key[0]}: split into {1 + len(parts)} parts: {self._describe(parts)}")

    def _describe(self, parts: list) -> str:
        kernels = {k: "+".join(dict.fromkeys(map(self.kernel, self.workqueue[k]))) for k in parts}
        return ", ".join(f"{len(self.workqueue[k])} checks of {kernels[k]}" for k in parts)

    def _new_parts(self, track: str, groups: list) -> list:
        """A new unit of `track` for each group of tests, queued last: their keys."""
        keys = []
        for group in groups:
            self.parts[track] += 1
            keys.append((track, self.parts[track]))
            self.workqueue[keys[-1]] = dict.fromkeys(group, False)
        return keys

    def _first(self, key) -> str:
        return next(iter(self.workqueue[key]))

    # -- sharing a slow track ----------------------------------------------------------------
    def _share_the_rest(self) -> None:
        """No track left to hand out: an idle worker steals from the slowest track, if any is
        worth it; with none, the idle workers that hold a test are shut down, so it runs."""
        idle = [node for node in self.nodes
                if not node.shutting_down and self._pending_of(self.assigned_work[node]) < RUNNING]
        if not idle or self.requests:  # one steal at a time; the answer calls again
            return
        victim, key, tests, seconds = self._most_worth_stealing()
        if victim is None:
            for node in idle:
                if self._pending_of(self.assigned_work[node]):
                    node.shutdown()
            return
        # A worker that holds a test back first: a steal lets it run that one too.
        thief = max(idle, key=lambda node: self._pending_of(self.assigned_work[node]))
        self.requests[victim] = Request(victim, thief, key, seconds)
        self.log(f"asking {victim.gateway.id} for {len(tests)} checks of {key[0]} for {thief.gateway.id} "
                 f"(about {seconds:.0f} s left)")
        victim.send_steal([self.position[nodeid] for nodeid in tests])

    def _most_worth_stealing(self):
        """(victim, unit key, tests to steal, seconds left) of the unit whose queued checks are
        expected to take longest, at least steal_min_s; (None,) * 4 when there is none."""
        best = (None, None, None, 0.0)
        for node, units in self.assigned_work.items():
            pending = [(key, nodeid) for key, unit in units.items() for nodeid, done in unit.items() if not done]
            queued = pending[RUNNING:]
            for key in dict.fromkeys(key for key, _ in queued):
                track = key[0]
                if track not in self.completed:  # only a completed check proves anything
                    continue
                seconds, count = self.completed[track]
                limit = self.share_limit(track)
                mine = [nodeid for k, nodeid in queued if k == key
                        and (limit is None or (self.case_size(nodeid) or limit) < limit)]
                left = len(mine) * seconds / count
                if left < self.steal_min_s or (best[0] is not None and left <= best[3]):
                    continue
                if tests := later_half(units[key], mine, self.shared_call):
                    best = (node, key, tests, left)
        return best

    def remove_pending_tests_from_node(self, node, indices) -> None:
        """The victim's answer: the tests it removed from its queue, or none if some of those asked
        for had started (xdist/remote.py steal)."""
        request = self.requests.pop(node, None)
        if request is None or node not in self.assigned_work:
            return  # the answer of a worker removed since
        nodeids = [self.registered_collections[node][index] for index in indices]
        if nodeids and request.thief is None:
            unit = self.assigned_work[node][request.key]
            for nodeid in nodeids:
                del unit[nodeid]
            parts = self._new_parts(request.key[0], request.groups)
            self._to_head(parts)
            self._say(f"{request.key[0]}: from {node.gateway.id} to the head of the queue, {len(parts)} part(s): "
                      f"{self._describe(parts)}")
        elif nodeids:
            unit = self.assigned_work[node][request.key]
            for nodeid in nodeids:
                del unit[nodeid]
            self.parts[request.key[0]] += 1
            key = (request.key[0], self.parts[request.key[0]])
            thief = self._thief(request.thief)
            if thief is None:  # no idle worker now: the first to ask gets it
                self.workqueue[key] = dict.fromkeys(nodeids, False)
                self.workqueue.move_to_end(key, last=False)
            else:
                self.assigned_work[thief][key] = dict.fromkeys(nodeids, False)
                thief.send_runtest_some(indices)
            steal = Steal(request.key[0], node.gateway.id, thief.gateway.id if thief else "the next free worker",
                          len(nodeids), request.seconds)
            self.steals.append(steal)
            self.log(steal.line())
            if self.on_steal is not None:
                self.on_steal(steal)
        else:
            self.log(f"{node.gateway.id} had started the checks of {request.key[0]} asked for")
        for other in self.nodes:
            self._reschedule(other)

    def _thief(self, chosen):
        """The worker that asked, if still idle, else another idle worker, else None."""
        idle = [node for node in self.nodes
                if not node.shutting_down and self._pending_of(self.assigned_work[node]) < RUNNING]
        return chosen if chosen in idle else next(iter(idle), None)


def by_kernel(nodeids: list, kernel) -> list:
    """The tests grouped by `kernel(nodeid)`, each group and the groups in the order they come."""
    groups = {}
    for nodeid in nodeids:
        groups.setdefault(kernel(nodeid), []).append(nodeid)
    return list(groups.values())


def later_half(unit: dict, queued: list, shared_call) -> list:
    """The later half of a unit's `queued` tests (rounded up), with the checks of their cases that
    are queued too: forward and backward of a case share one runner call (`shared_call(nodeid)`).
    A case of which a check has run or is running (on the victim, whose runner has the reply) stays
    whole there."""
    cases = {shared_call(nodeid) for nodeid in queued[len(queued) // 2:]}
    staying = {shared_call(nodeid) for nodeid in unit.keys() - set(queued)}
    return [nodeid for nodeid in queued if shared_call(nodeid) in cases and shared_call(nodeid) not in staying]


def spread_timing(keys: list, is_timing) -> list:
    """The unit keys in their order, but for the timing tracks', which are spread evenly through
    the rest: T of them among O others, the j-th at about (j + 0.5) * (O + T) / T."""
    timing = [key for key in keys if is_timing(key[0])]
    spread = [key for key in keys if not is_timing(key[0])]
    for j, key in enumerate(timing):
        spread.insert(int((j + 0.5) * len(keys) / len(timing)), key)
    return spread
