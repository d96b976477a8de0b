"""The server's collector settings, applied once startup is done."""

import gc

from service.gc_tuning import YOUNG_THRESHOLD, settle_after_startup


def test_startup_objects_are_frozen_and_young_collections_are_rarer() -> None:
    before = gc.get_threshold()
    try:
        settle_after_startup()
        assert gc.get_freeze_count() > 0
        assert gc.get_threshold() == (YOUNG_THRESHOLD, *before[1:])
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
