"""pgpoll.xids: widening 32-bit transaction ids to full ids, and snapshot visibility, as PostgreSQL does them."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pgpoll.xids import Snapshot, parse_snapshot, widen_xid

EPOCH = 1 << 32
HALF = 1 << 31
PROPERTY = settings(derandomize=True, max_examples=300, deadline=None)


def test_an_id_at_or_below_the_reference_keeps_the_reference_epoch() -> None:
    assert widen_xid(100, 100) == 100
    assert widen_xid(99, 100) == 99
    assert widen_xid(100, 7 * EPOCH + 100) == 7 * EPOCH + 100
    assert widen_xid(3, 7 * EPOCH + 1000) == 7 * EPOCH + 3


def test_an_id_above_the_reference_low_bits_is_from_the_previous_epoch() -> None:
    # the reference has just wrapped (epoch 8, low bits 5): 0xFFFFFFF0 was assigned in epoch 7
    assert widen_xid(0xFFFFFFF0, 8 * EPOCH + 5) == 7 * EPOCH + 0xFFFFFFF0
    assert widen_xid(0xFFFFFFFF, 8 * EPOCH) == 8 * EPOCH - 1


def test_the_widest_distance_allowed_is_just_under_two_to_the_31() -> None:
    reference = 8 * EPOCH + 5
    oldest = reference - HALF + 1
    assert widen_xid(oldest % EPOCH, reference) == oldest
    with pytest.raises(ValueError, match="not within 2\\^31"):
        widen_xid((reference - HALF) % EPOCH, reference)


def test_an_id_newer_than_the_reference_is_refused_not_misplaced() -> None:
    # 10 ahead of the reference would otherwise land a whole epoch early
    with pytest.raises(ValueError, match="not within 2\\^31"):
        widen_xid(15, 8 * EPOCH + 5)
    with pytest.raises(ValueError, match="not within 2\\^31"):
        widen_xid(200, 100)  # epoch 0: there is no earlier epoch


@pytest.mark.parametrize("xid", [-1, EPOCH, EPOCH + 5])
def test_an_id_that_is_not_32_bit_is_refused(xid: int) -> None:
    with pytest.raises(ValueError, match="not a 32-bit transaction id"):
        widen_xid(xid, 8 * EPOCH)


def test_a_negative_reference_is_refused() -> None:
    with pytest.raises(ValueError, match="not a full transaction id"):
        widen_xid(3, -1)


@PROPERTY
@given(st.integers(min_value=HALF, max_value=(1 << 62)), st.integers(min_value=0, max_value=HALF - 1))
def test_widening_inverts_truncation_within_half_the_id_space(reference: int, behind: int) -> None:
    full = reference - behind
    assert widen_xid(full % EPOCH, reference) == full


@PROPERTY
@given(st.integers(min_value=0, max_value=(1 << 62)), st.integers(min_value=0, max_value=EPOCH - 1))
def test_a_widened_id_has_the_same_low_bits_and_is_never_newer_than_the_reference(reference: int, xid: int) -> None:
    behind = (reference - xid) % EPOCH  # how far the only candidate with these low bits is below the reference
    if behind >= HALF or reference - behind < 0:
        with pytest.raises(ValueError):
            widen_xid(xid, reference)
        return
    full = widen_xid(xid, reference)
    assert full % EPOCH == xid and 0 <= reference - full < HALF and full == reference - behind


# ---- snapshots ---------------------------------------------------------------------------


def test_parse_snapshot_reads_what_postgresql_prints() -> None:
    snap = parse_snapshot("30064771800:30064771810:30064771802,30064771805")
    assert snap == Snapshot(30064771800, 30064771810, (30064771802, 30064771805))
    assert snap.text == "30064771800:30064771810:30064771802,30064771805"
    assert parse_snapshot("100:100:") == Snapshot(100, 100, ())
    assert parse_snapshot(" 7:9:8\n").xip == (8,)


def test_parse_snapshot_sorts_xip_as_the_server_does() -> None:
    assert parse_snapshot("10:20:15,11").xip == (11, 15)


@pytest.mark.parametrize(
    "text", ["", "10:20", "10:20:15:1", "a:20:", "20:10:", "10:20:9", "10:20:20", "10:20:x", "1.5:2:"],
)
def test_parse_snapshot_refuses_anything_else(text: str) -> None:
    with pytest.raises(ValueError):
        parse_snapshot(text)


def test_visibility_follows_pg_visible_in_snapshot() -> None:
    snap = Snapshot(100, 110, (103, 107))
    assert snap.visible(99) and snap.visible(0)  # below xmin: committed before the snapshot
    assert snap.visible(100) and snap.visible(104) and snap.visible(109)  # between, not in progress
    assert not snap.visible(103) and not snap.visible(107)  # in progress when taken
    assert not snap.visible(110) and not snap.visible(10**12)  # at or above xmax: not yet started


def test_snapshot_json_round_trip() -> None:
    snap = Snapshot(7 * EPOCH + 1, 7 * EPOCH + 9, (7 * EPOCH + 4,))
    data = snap.to_json()
    assert data == {"text": snap.text, "xmin": snap.xmin, "xmax": snap.xmax, "xip": [snap.xip[0]]}
    assert Snapshot.from_json(data) == snap
    assert Snapshot.from_json({"xmin": 5, "xmax": 5}) == Snapshot(5, 5, ())
    assert parse_snapshot(snap.text) == snap


@st.composite
def snapshots(draw: st.DrawFn) -> Snapshot:
    xmin = draw(st.integers(min_value=3, max_value=1 << 40))
    xmax = xmin + draw(st.integers(min_value=0, max_value=50))
    xip = draw(st.sets(st.integers(min_value=xmin, max_value=max(xmin, xmax - 1)), max_size=10)) if xmax > xmin else set()
    return Snapshot(xmin, xmax, tuple(sorted(xip)))


@PROPERTY
@given(snapshots(), st.integers(min_value=-5, max_value=60))
def test_visibility_property(snap: Snapshot, offset: int) -> None:
    xid = snap.xmin + offset
    expected = xid < snap.xmin or (xid < snap.xmax and xid not in snap.xip)
    assert snap.visible(xid) is expected
    assert parse_snapshot(snap.text) == snap  # the text round-trips
    # a later snapshot (xmax moved on, nothing new in progress) sees at least as much
    later = Snapshot(snap.xmin, snap.xmax + 10, snap.xip)
    assert not snap.visible(xid) or later.visible(xid)


@PROPERTY
@given(snapshots())
def test_every_id_below_xmin_is_visible_and_none_from_xmax(snap: Snapshot) -> None:
    assert snap.visible(snap.xmin - 1)
    assert not snap.visible(snap.xmax)
    assert all(not snap.visible(x) for x in snap.xip)
