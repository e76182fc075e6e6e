"""Which runner of its submission a grading test uses on a GPU (grading/tracks.py)."""
import importlib
from types import SimpleNamespace

import pytest

from fa2_sandbox.wire.cases import FLASH_SLOTS, FlashCase
from grading import matrix, tracks
from grading.declaration import Declared, declared_check
from grading.rubric import Rubric
from grading.tracks import Track


def item(module: str, name: str, **params):
    """A grading test of `module` (a real checks module: its marker declares the track) with `params`."""
    return fake_item(importlib.import_module(f"grading.checks.{module}"), name, params)


def fake_item(module, name: str, params: dict):
    """A collected test of `module` as the grader reads it: its module's markers, name and parameters."""
    mark = getattr(module, "pytestmark", None)
    return SimpleNamespace(module=module, originalname=name,
                           get_closest_marker=lambda marker: mark if mark is not None and mark.name == marker else None,
                           callspec=SimpleNamespace(params={"submission": "alice", **params}))


CASE = FlashCase(batch=(2,), n_queries=113, n_keys=203, head_dim=64, dtype="bfloat16", is_causal=True)


def test_triton_cases_split_by_what_triton_compiles_for():
    assert tracks.track_of(item("test_flash", "test_forward", slot="triton", tier="causal", case=CASE), set()) \
        == Track("triton-bf16-causal-d64")
    # forward and backward of one case share a track, so they share the runner call
    assert tracks.track_of(item("test_flash", "test_backward", slot="triton", tier="causal", case=CASE), set()) \
        == Track("triton-bf16-causal-d64")
    fp32 = FlashCase(head_dim=16)
    assert tracks.track_of(item("test_flash", "test_forward", slot="triton", tier="course", case=fp32), set()) \
        == Track("triton-fp32-full-d16")


def test_a_class_that_fills_the_workers_tracks_triton_by_dtype_and_causal_flag():
    assert tracks.per_kernel_tracks(submissions=1, workers=16)
    assert tracks.per_kernel_tracks(submissions=3, workers=16)  # 12 (dtype, causal) tracks: 4 workers idle
    assert not tracks.per_kernel_tracks(submissions=4, workers=16)
    assert not tracks.per_kernel_tracks(submissions=21, workers=32)  # the corpus class on two GPUs
    d16 = FlashCase(head_dim=16, dtype="bfloat16", is_causal=True)
    for case in (CASE, d16):  # two kernels, one runner
        assert tracks.track_of(item("test_flash", "test_forward", slot="triton", tier="causal", case=case), set(),
                               per_kernel=False) == Track("triton-bf16-causal")


def test_a_stubbed_triton_slot_stays_one_track():
    stub = {FLASH_SLOTS["triton"]}
    assert tracks.track_of(item("test_flash", "test_forward", slot="triton", tier="causal", case=CASE), stub) \
        == Track("triton")


def test_other_parts():
    assert tracks.track_of(item("test_flash", "test_forward", slot="pytorch", tier="handout", case=CASE), set()) \
        == Track("pytorch")
    # the PyTorch slot on CUDA joins its timing runner: its runner on the CPU never starts CUDA
    assert tracks.track_of(item("test_flash", "test_runs_on_cuda", device="cuda"), set()) == Track("timing-pytorch")
    # a check of one case (hygiene, implementation) joins its case's track, whose reply and kernels it shares
    assert tracks.track_of(item("test_flash", "test_hygiene", slot="triton", tier="handout", case=CASE), set()) \
        == Track("triton-bf16-causal-d64")
    # one runner, whose ranks serve every distributed check (one spawn, not one per check family)
    assert tracks.track_of(item("test_distributed", "test_ddp_equivalence", flavour="bucketed",
                                model_name="toy"), set()) == Track("distributed")
    assert tracks.track_of(item("test_distributed", "test_sharded_equivalence", scenario="adamw"), set()) \
        == Track("distributed")
    assert tracks.track_of(item("test_fsdp", "test_fsdp_equivalence", precision="fp32"), set()) == Track("distributed")
    assert tracks.track_of(item("test_timing", "test_budget", slot="triton"), set()) == Track("timing-triton")
    assert tracks.track_of(item("test_memory", "test_no_score_matrix", slot="triton", phase="forward"), set()) \
        == Track("memory-triton")


def test_the_pytorch_slots_memory_check_shares_the_slots_runner():
    """Its case is one of the slot's own (the handout's causal fp32 d=64 case at N = 1024), so the
    slot's reply serves it, and the requirement is graded wherever the slot is."""
    from grading.matrix import MEMORY_CASE, flash_cases

    assert tracks.track_of(item("test_memory", "test_no_score_matrix", slot="pytorch", phase="forward"), set()) \
        == Track("pytorch")
    for on_gpu in (False, True):
        assert MEMORY_CASE in [case for _, case in flash_cases("pytorch", on_gpu)]
    # N x N is what the check looks for: it must dwarf every tile and every O(N d) tensor
    assert MEMORY_CASE.n_queries * MEMORY_CASE.n_keys >= 8 * MEMORY_CASE.n_queries * 128


def test_memory_checks_go_early_in_their_track():
    """Collected last, the tiling requirement came after some eighty cases of its runner. Right after
    the track's smallest case: a class that hangs times out there once, and the memory case fails at
    once as larger (first, it timed out on the memory case and then again on the smallest)."""
    small = FlashCase(n_queries=17, n_keys=17)
    items = [item("test_flash", "test_forward", slot="pytorch", case=small),
             item("test_flash", "test_backward", slot="pytorch", case=CASE),
             item("test_memory", "test_no_score_matrix", slot="pytorch", phase="forward"),
             item("test_flash", "test_forward", slot="triton", case=CASE),
             item("test_memory", "test_no_score_matrix", slot="pytorch", phase="backward"),
             item("test_memory", "test_no_score_matrix", slot="triton", phase="forward")]
    track = {id(i): g for i, g in zip(items, ["a", "a", "a", "b", "a", "c"])}
    ordered = list(items)
    tracks.memory_early(ordered, lambda i: track[id(i)])
    assert [items.index(i) for i in ordered] == [0, 2, 4, 3, 1, 5]


def test_every_runner_of_flash_checks_gets_a_second_input():
    """matrix.replay_cases: a case asked again on a second input in each track whose runner
    answers flash checks (one per slot on a CPU, where a submission has one runner), and the same
    cases whatever the schedule, since they depend on the machine alone."""
    for on_gpu in (False, True):
        for slot in FLASH_SLOTS:
            probed = matrix.replay_cases(slot, on_gpu)
            cases = [case for _, case in matrix.flash_cases(slot, on_gpu)]
            assert all(case in cases for _, case in probed)
            runners = {tracks.track_of(item("test_flash", "test_forward", slot=slot, tier=tier, case=case), set())
                       for tier, case in matrix.flash_cases(slot, on_gpu)}
            required = {tracks.track_of(item("test_flash", "test_forward", slot=slot, tier=tier, case=case), set())
                        for tier, case in matrix.flash_cases(slot, on_gpu) if tier in matrix.REQUIRED_TIERS[slot]}
            if on_gpu:  # every runner with a required case, and only those: odd head dims have none
                assert {tracks.track_of(item("test_flash", "test_replay", slot=slot, tier=tier, case=case), set())
                        for tier, case in probed} == required
                odd = {track for track in runners if track.name.endswith(("d48", "d80", "d96"))}
                assert runners - required == odd and (slot == "pytorch" or odd)
            else:
                assert len(probed) == 1
    # each on the smallest case of a tier the handout makes requirements of
    for slot, on_gpu in (("pytorch", False), ("triton", False), ("triton", True)):
        assert all(tier in matrix.REQUIRED_TIERS[slot] for tier, case in matrix.replay_cases(slot, on_gpu))
    assert [case.id for _, case in matrix.replay_cases("pytorch", False)] == ["fp32-128x128-d64-full"]  # course
    assert [case.id for _, case in matrix.replay_cases("triton", False)] == ["fp32-64x64-d16-full"]


def test_every_track_of_every_submission_is_an_xdist_group_of_its_own():
    names, kinds = ("alice", "s1", "s10", "bob.smith"), ("", "triton-bf16-causal-d64", "distributed")
    groups = [tracks.submission_track(name, Track(kind)) for name in names for kind in kinds]
    assert len(set(groups)) == len(groups)
    assert not any("@" in group for group in groups)  # xdist splits its group names at "@"


def test_heaviest_tracks_run_first():
    """Tracks are collected longest first (tracks.HEAVY_FIRST), Triton memory, whose cost has no
    bound for a slow Triton slot, first of all, and timing last; the scheduler hands them out in
    that order but for the timing tracks, which it spreads through the run (test_scheduler.py)."""
    names = ["pytorch", "distributed", "triton-bf16-causal-d64", "timing-pytorch", "timing-triton", "triton",
             "memory-triton"]
    ordered = sorted(names, key=lambda name: Track(name).rank)
    assert ordered == ["memory-triton", "pytorch", "distributed", "triton-bf16-causal-d64", "triton",
                       "timing-triton", "timing-pytorch"]


def test_a_track_is_a_kind_the_grader_knows():
    """A track's properties are its kind's (grading/tracks.py KINDS), and a name of no kind is
    refused with a sentence that says where kinds are declared: it used to sort last unnoticed."""
    assert Track("timing-triton").timing and not Track("triton-bf16-full-d64").timing
    assert Track("memory-triton").memory and not Track("pytorch").memory
    assert Track("triton-bf16-full-d64").kind is tracks.KINDS["triton"]
    for name in ("gpu-memory", "tritonic", "timing"):
        with pytest.raises(ValueError, match="no track kind named .* grading/tracks.py KINDS"):
            Track(name)


def test_a_checks_module_declares_a_track_not_a_name():
    marker = pytest.mark.grading(check_of=lambda test, params: ("ddp", "overlap", "default"),
                                 track=lambda params, per_kernel: "pytorch")
    module = SimpleNamespace(__name__="grading.checks.test_new", pytestmark=marker)
    with pytest.raises(pytest.UsageError, match="grading.checks.test_new's track gave 'pytorch' for test_new_thing, "
                                                "not a Track"):
        tracks.declared_track(fake_item(module, "test_new_thing", {}), True)


def test_a_checks_module_without_the_marker_stops_collection():
    """Where the declaration is missing, or leaves out a test, collection stops and says which."""
    bare = SimpleNamespace(__name__="grading.checks.test_bare")
    with pytest.raises(pytest.UsageError, match="grading.checks.test_bare declares no track for test_thing"):
        tracks.declared_track(fake_item(bare, "test_thing", {}), True)
    with pytest.raises(pytest.UsageError, match="grading.checks.test_bare declares no check_of for test_thing"):
        declared_check(fake_item(bare, "test_thing", {}), Rubric())
    flash = importlib.import_module("grading.checks.test_flash")
    with pytest.raises(pytest.UsageError, match="grading.checks.test_flash's check_of knows no check for test_new"):
        declared_check(fake_item(flash, "test_new", {"slot": "triton"}), Rubric())


def test_a_tests_check_is_what_its_module_declares():
    """The check fixture takes part, check and tier from the declaration: one place says them."""
    declared = declared_check(item("test_flash", "test_backward", slot="triton", tier="causal", case=CASE), Rubric())
    assert declared == Declared("flash_triton", "backward", "causal", "flash_triton.backward.causal")
    distributed = importlib.import_module("grading.checks.test_distributed")
    sharded = declared_check(fake_item(distributed, "test_sharded_state", {"name": "state_sharded"}), Rubric())
    assert (sharded.part, sharded.check) == ("sharded_optimizer", "state_sharded")


def test_a_tracks_checks_run_together():
    """Without xdist the list's order is the run order, and a process closes a track's runner when
    another track's check comes: each track together, in the order the tracks first appear."""
    items = [item("test_flash", "test_forward", slot="pytorch", case=CASE) for _ in range(6)]
    track = {id(i): g for i, g in zip(items, ["a", "b", None, "a", "b", "a"])}
    ordered = list(items)
    tracks.tracks_together(ordered, lambda i: track[id(i)])
    place = {id(i): k for k, i in enumerate(items)}  # the items are equal: tell them apart by identity
    assert [place[id(i)] for i in ordered] == [0, 3, 5, 1, 4, 2]


def test_a_tracks_flash_checks_go_smallest_case_first():
    """A runner fails at once a case no smaller than one that timed out: smallest first, a
    submission that hangs waits out one timeout, not one per size (tracks.smallest_case_first)."""
    big, small = FlashCase(n_queries=1024, n_keys=1024, dtype="bfloat16"), FlashCase(n_queries=17, n_keys=17)
    items = [item("test_flash", "test_hygiene", slot="pytorch", case=big),
             item("test_flash", "test_forward", slot="pytorch", case=CASE),
             item("test_memory", "test_no_score_matrix", slot="pytorch", phase="forward"),
             item("test_flash", "test_forward", slot="triton", case=big),
             item("test_flash", "test_forward", slot="pytorch", case=small),
             item("test_flash", "test_backward", slot="pytorch", case=small)]
    track = {id(i): g for i, g in zip(items, ["a", "a", "a", "b", "a", None])}
    ordered = list(items)
    tracks.smallest_case_first(ordered, lambda i: track[id(i)])
    # track a's three flash checks fill track a's flash places smallest first; the memory check keeps
    # its place, track b's and the ungrouped check theirs
    assert [items.index(i) for i in ordered] == [4, 1, 2, 3, 0, 5]


def test_every_tracks_runner_log_reaches_the_report():
    """A submission spread over tracks has a runner log per track: results.json shows each under
    its track's name (not only the last track's, as before), within one size budget."""
    from grading.controller import LOG_TAILS_CHARS, joined_logs

    assert joined_logs({"": "only runner\n"}) == "only runner\n"
    logs = {"triton-bf16-causal-d64": "x" * 50000 + "END-A", "ddp-ddp": "spawned 2 ranks\nEND-B"}
    text = joined_logs(logs)
    assert "--- the runner of ddp-ddp ---\nspawned 2 ranks\nEND-B" in text
    assert "--- the runner of triton-bf16-causal-d64 ---\n" in text and text.rstrip().endswith("END-A")
    assert len(text) <= LOG_TAILS_CHARS + 200
