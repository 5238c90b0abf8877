"""The prepared models a torch runtime keeps, by engine file and shape point."""

from __future__ import annotations

from pipeline.runtimes.pytorch.prepared import KeptModels, Prepared

FILE, OTHER = (1, 10, 100), (2, 10, 100)


def prepared(identity, shape) -> Prepared:
    return Prepared(engine_file=identity, run=lambda: None, examples=(), device="cpu", shape=shape, model=f"model of {identity}")


def test_a_profile_takes_its_point_and_the_file_s_other_points_go_but_those_held_for_their_profiles():
    kept = KeptModels()
    for shape in ("2x8", "2x16", "4x16"):
        kept.keep(prepared(FILE, shape))
        kept.hold_for_profiles(FILE)  # prepared ahead, each as the run waits
    kept.keep(prepared(OTHER, "2x8"))  # another engine's: never touched here
    first, _ = kept.take(FILE, "2x8")
    assert first.shape == "2x8" and all(kept.has(FILE, shape) for shape in ("2x16", "4x16"))
    second, lender = kept.take(FILE, "2x16")
    assert second.shape == "2x16" and lender is not None
    assert not kept.has(FILE, "2x8")  # taken by its profile, and the sweep has moved on
    assert kept.has(FILE, "4x16") and kept.has(OTHER, "2x8")


def test_a_point_nothing_prepared_borrows_the_newest_model_of_its_file_which_then_goes():
    kept = KeptModels()
    kept.keep(prepared(FILE, "2x8"))  # a build's own point, not held
    missing, lender = kept.take(FILE, "2x16")
    assert missing is None and lender.shape == "2x8" and lender.model == f"model of {FILE}"
    assert not kept.has(FILE, "2x8")


def test_a_build_drops_what_was_prepared_at_other_points_but_keeps_what_is_held():
    kept = KeptModels()
    kept.keep(prepared(FILE, "2x8"))
    kept.keep(prepared(OTHER, "2x16"))
    kept.keep(prepared(OTHER, "2x8"))
    kept.hold_for_profiles(OTHER)
    kept.keep(prepared((3, 1, 1), "2x16"))
    kept.only_at("2x8")
    assert kept.has(FILE, "2x8") and kept.has(OTHER, "2x16") and kept.has(OTHER, "2x8") and not kept.has((3, 1, 1), "2x16")
