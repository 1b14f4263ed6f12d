"""Environment perturbations of recorded tool results (metrics.md §4 "env"): pure, seeded and
meaning-preserving. Meaning is checked with a decoder written here, independently of the module:
it unwraps ``{"status": "ok", "data": …}``, maps camelCase / kebab-case keys back to snake_case,
parses US dates and epoch seconds back to the original's ISO format and strips thousands
separators."""

from __future__ import annotations

import copy
import json
import re
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relyscope.shadow.envperturb import ENV_STRENGTHS, ENV_TRANSFORMS, EnvPerturbation, apply_transforms, perturb_result

ORDERS = {
    "request_id": "req_8f2a",
    "orders": [
        {"order_id": "ORD-1042", "created_at": "2026-03-01T14:05:00Z", "ship_date": "2026-03-04",
         "total_amount": 12345.5, "item_count": 3, "is_gift": False, "coupon_code": None,
         "line_items": [{"sku": "A-1", "unit_price": 19.99, "qty": 2}, {"sku": "B-7", "unit_price": 12305.52, "qty": 1}]},
        {"order_id": "ORD-1043", "created_at": "2026-11-30T23:59:59.250+02:00", "ship_date": "2026-12-02",
         "total_amount": 1000000, "item_count": 1, "is_gift": True, "coupon_code": "WINTER",
         "line_items": []},
    ],
    "page": {"next_cursor": None, "page_size": 50, "total_count": 1234},
}
CUSTOMER = {
    "customer_id": "cus_77", "full_name": "Zoë Martin", "email": "zoe@example.com",
    "signup_date": "2019-07-04", "last_login_at": "2026-02-28 08:30", "lifetime_value": -2500.75,
    "address": {"street_name": "Rue de Rivoli", "address_line_1": "Apt 4", "postal_code": "75001"},
    "loyalty_points": 98765, "email_verified": True, "tags": ["vip", "2026-01-01"],
}
REALISTIC = [ORDERS, CUSTOMER, [ORDERS["orders"][0], CUSTOMER], json.dumps(CUSTOMER), "2026-03-01"]

# ---------------------------------------------------------------------------- independent decoder

_US = re.compile(r"(\d{2})/(\d{2})/(\d{4})(?: (\d{2}):(\d{2})(?::(\d{2})(\.\d+)?)? (AM|PM))?(?: (UTC|[+-]\d{2}:\d{2}))?")
_ISO_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
_ISO_TIME = re.compile(r"(\d{4}-\d{2}-\d{2})([T ])(\d{2}:\d{2})(:\d{2})?(\.\d+)?(Z|[+-]\d{2}:\d{2})?")
_GROUPED = re.compile(r"-?\d{1,3}(,\d{3})*(\.\d+)?(e[+-]\d+)?|-?\d+(\.\d+)?(e[+-]\d+)?")


def _snake(key: str) -> str:
    return re.sub(r"[A-Z]", lambda m: "_" + m.group().lower(), key).replace("-", "_")


def _number(text: str) -> float | int:
    assert _GROUPED.fullmatch(text), text
    plain = text.replace(",", "")
    return float(plain) if any(c in plain for c in ".e") else int(plain)


def _instant(p: object) -> datetime:
    """The instant a perturbed date value denotes (US text, epoch seconds, or ISO)."""
    if isinstance(p, str) and _GROUPED.fullmatch(p):
        p = _number(p)
    if isinstance(p, (int, float)):
        return datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(microseconds=round(p * 1_000_000))
    assert isinstance(p, str)
    m = _US.fullmatch(p)
    if m is None:
        return _iso_instant(p)
    mo, d, y, hh, mi, ss, frac, ampm, tz = m.groups()
    hour = 0 if hh is None else int(hh) % 12 + (12 if ampm == "PM" else 0)
    micro = 0 if frac is None else int((frac[1:] + "000000")[:6])
    zone = timezone.utc if tz in (None, "UTC") else timezone(
        (1 if tz[0] == "+" else -1) * timedelta(hours=int(tz[1:3]), minutes=int(tz[4:6])))
    return datetime(int(y), int(mo), int(d), hour, int(mi or 0), int(ss or 0), micro, tzinfo=zone)


def _iso_instant(s: str) -> datetime:
    dt = datetime.fromisoformat(s.replace("Z", "+00:00"))
    return dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)


def _format_like(dt: datetime, like: str) -> str:
    """``dt`` written in the ISO format of ``like`` (same separator, precision and zone)."""
    if _ISO_DATE.fullmatch(like):
        return dt.astimezone(timezone.utc).date().isoformat()
    date_part, sep, hm, sec, frac, tz = _ISO_TIME.fullmatch(like).groups()
    local = dt.astimezone(_iso_instant(like).tzinfo)
    out = local.strftime("%Y-%m-%d") + sep + local.strftime("%H:%M")
    if sec:
        out += local.strftime(":%S")
    if frac:
        out += "." + f"{local.microsecond:06d}"[: len(frac) - 1]
    if tz:
        out += tz
    return out


def decode(p: object, like: object) -> object:
    """Recover ``like`` from its perturbed form ``p`` (``like`` guides only scalar types)."""
    if isinstance(like, dict):
        assert isinstance(p, dict), p
        snake = {_snake(k): v for k, v in p.items()}
        assert len(snake) == len(p) and set(snake) == set(like), (sorted(snake), sorted(like))
        return {k: decode(snake[k], like[k]) for k in like}
    if isinstance(like, list):
        assert isinstance(p, list) and len(p) == len(like)
        return [decode(a, b) for a, b in zip(p, like)]
    if isinstance(like, str) and (_ISO_DATE.fullmatch(like) or _ISO_TIME.fullmatch(like)):
        return _format_like(_instant(p), like)
    if isinstance(like, (int, float)) and not isinstance(like, bool) and isinstance(p, str):
        n = _number(p)
        return float(n) if isinstance(like, float) else n
    return p


def decode_result(p: object, original: object) -> object:
    """``original`` recovered from ``p``; a JSON-holding string comes back as its decoded value."""
    # (an empty string is no JSON: '' in "{[" is True in Python, so test the first character itself)
    if isinstance(original, str) and original.lstrip()[:1] in ("{", "["):
        assert isinstance(p, str)
        return decode_result(json.loads(p), json.loads(original))
    if isinstance(p, dict) and set(p) == {"status", "data"} and p["status"] == "ok":
        p = p["data"]
    return decode(p, original)


def _plain(v: object) -> object:
    return json.loads(v) if isinstance(v, str) and v.lstrip()[:1] in ("{", "[") else v


def _same(a: object, b: object) -> bool:
    """Equal values with equal types (True != 1 and 1.0 != "1.0" here); key order ignored; a
    JSON-holding string compares as its decoded value."""
    return json.dumps(_plain(a), sort_keys=True) == json.dumps(_plain(b), sort_keys=True)


def _changed(a: object, b: object) -> bool:
    """Different text, key order included."""
    return json.dumps(_plain(a)) != json.dumps(_plain(b))

# ---------------------------------------------------------------------------- decoder self-checks


def test_decoder_rejects_a_changed_value() -> None:
    """The decoder can fail: a perturbation that changed a fact is not decoded back."""
    wrong = copy.deepcopy(CUSTOMER)
    wrong["signup_date"] = "07/05/2019"
    assert not _same(decode_result(wrong, CUSTOMER), CUSTOMER)
    wrong = dict(CUSTOMER, loyaltyPoints="98,766")
    wrong.pop("loyalty_points")
    assert not _same(decode_result(wrong, CUSTOMER), CUSTOMER)

# ---------------------------------------------------------------------------- worked examples


def test_each_transform_on_a_hand_worked_example() -> None:
    r = {"created_at": "2026-03-01T14:05:00Z", "total_amount": 12345.5, "ok": True, "ship_date": "2026-03-04"}
    assert apply_transforms(r, ["us_dates"]).value == {
        "created_at": "03/01/2026 02:05:00 PM UTC", "total_amount": 12345.5, "ok": True, "ship_date": "03/04/2026"}
    # 2026-03-01 is day 20 513 after 1970-01-01 (56 years, 14 leap days, + 59 days): 20513 * 86400
    assert apply_transforms(r, ["epoch_dates"]).value == {
        "created_at": 1772323200 + 14 * 3600 + 5 * 60, "total_amount": 12345.5, "ok": True,
        "ship_date": 1772323200 + 3 * 86400}
    assert apply_transforms(r, ["thousands_separators"]).value == {
        "created_at": "2026-03-01T14:05:00Z", "total_amount": "12,345.5", "ok": True, "ship_date": "2026-03-04"}
    assert apply_transforms(r, ["camel_case_keys"]).value == {
        "createdAt": "2026-03-01T14:05:00Z", "totalAmount": 12345.5, "ok": True, "shipDate": "2026-03-04"}
    assert apply_transforms(r, ["kebab_case_keys"]).value == {
        "created-at": "2026-03-01T14:05:00Z", "total-amount": 12345.5, "ok": True, "ship-date": "2026-03-04"}
    assert apply_transforms(r, ["wrap_status"]).value == {"status": "ok", "data": r}
    reordered = apply_transforms(r, ["reorder_keys"], seed=3).value
    assert reordered == r and list(reordered) != list(r)


def test_us_dates_keep_precision_and_zone() -> None:
    cases = {
        "2026-11-30T23:59:59.250+02:00": "11/30/2026 11:59:59.250 PM +02:00",
        "2026-02-28 08:30": "02/28/2026 08:30 AM",
        "2026-01-01T00:00:00": "01/01/2026 12:00:00 AM",
        "2026-06-15T12:00:00-05:00": "06/15/2026 12:00:00 PM -05:00",
    }
    for iso, us in cases.items():
        assert apply_transforms(iso, ["us_dates"]).value == us


def test_not_dates_and_not_numbers_are_left_alone() -> None:
    r = {"note": "shipped 2026-03-01 by post", "bad_date": "2026-13-45", "zip": "75001", "flag": False,
         "nothing": None, "ratio": float("nan")}
    out = apply_transforms(r, ["us_dates", "thousands_separators"])
    assert out.transforms == ()
    assert json.dumps(out.value) == json.dumps(r)


def test_keys_not_in_snake_case_or_colliding_are_kept() -> None:
    r = {"address_line_1": 1, "SKU": 2, "already": 3, "order_id": 4, "orderId": 5, "x-trace": 6}
    assert list(apply_transforms(r, ["camel_case_keys"]).value) == list(r)  # nothing renamable: no-op
    assert apply_transforms(r, ["camel_case_keys"]).transforms == ()
    assert list(apply_transforms(r, ["kebab_case_keys"]).value) == [
        "address_line_1", "SKU", "already", "order-id", "orderId", "x-trace"]


def test_strength_rules() -> None:
    for seed in range(60):
        mild = perturb_result(ORDERS, seed=seed, strength="mild").transforms
        assert mild[-2:] in (("camel_case_keys", "reorder_keys"), ("us_dates", "reorder_keys"),
                             ("reorder_keys", "wrap_status")) and len(mild) == 2
        medium = perturb_result(ORDERS, seed=seed, strength="medium").transforms
        others = [t for t in medium if t != "reorder_keys"]
        assert "reorder_keys" in medium and len(others) == 2
        fam = {"camel_case_keys": "k", "kebab_case_keys": "k", "us_dates": "d", "epoch_dates": "d",
               "thousands_separators": "n", "wrap_status": "w"}
        assert fam[others[0]] != fam[others[1]]
        assert perturb_result(ORDERS, seed=seed, strength="severe").transforms == (
            "epoch_dates", "thousands_separators", "kebab_case_keys", "reorder_keys", "wrap_status")


def test_strength_only_uses_applicable_transforms() -> None:
    # a bare date string: no keys, no numbers -> severe is epoch + wrap
    out = perturb_result("2026-03-01", seed=0, strength="severe")
    assert out == EnvPerturbation({"status": "ok", "data": 1772323200}, ("epoch_dates", "wrap_status"))
    # a scalar with nothing to reformat is still perturbed (wrap always applies)
    for strength in ENV_STRENGTHS:
        assert perturb_result("plain text", seed=1, strength=strength).value == {"status": "ok", "data": "plain text"}


def test_json_string_stays_a_string() -> None:
    out = perturb_result(json.dumps(CUSTOMER), seed=5, strength="severe")
    assert isinstance(out.value, str)
    decoded = json.loads(out.value)
    assert decoded["status"] == "ok" and decoded["data"]["loyalty-points"] == "98,765"

# ---------------------------------------------------------------------------- meaning preserved


@pytest.mark.parametrize("transform", ENV_TRANSFORMS)
@pytest.mark.parametrize("result", REALISTIC, ids=["orders", "customer", "list", "json-str", "date-str"])
def test_each_transform_preserves_meaning(transform: str, result: object) -> None:
    out = apply_transforms(result, [transform], seed=9)
    assert out.transforms in ((transform,), ())
    assert _same(decode_result(out.value, result), result)
    if out.transforms:
        assert _changed(out.value, result)


@pytest.mark.parametrize("strength", ENV_STRENGTHS)
@pytest.mark.parametrize("result", REALISTIC, ids=["orders", "customer", "list", "json-str", "date-str"])
def test_each_strength_preserves_meaning(strength: str, result: object) -> None:
    for seed in range(25):
        out = perturb_result(result, seed=seed, strength=strength)
        assert out.transforms and _changed(out.value, result)
        assert _same(decode_result(out.value, result), result), (seed, out.transforms)


def test_fractional_epoch_round_trips() -> None:
    r = {"at": "2026-03-01T14:05:00.123456Z", "when": "1999-12-31T23:59:59.999999-08:00"}
    out = apply_transforms(r, ["epoch_dates", "thousands_separators"])
    assert _same(decode(out.value, r), r)

# ---------------------------------------------------------------------------- purity and seeds


def test_deterministic_and_input_untouched() -> None:
    for result in REALISTIC:
        before = json.dumps(result)
        for strength in ENV_STRENGTHS:
            a = perturb_result(result, seed=42, strength=strength)
            b = perturb_result(copy.deepcopy(result), seed=42, strength=strength)
            assert a == b and json.dumps(a.value) == json.dumps(b.value)  # key order too
        assert json.dumps(result) == before


def test_different_seeds_give_different_outputs() -> None:
    for strength in ENV_STRENGTHS:
        outs = {json.dumps(perturb_result(ORDERS, seed=s, strength=strength).value) for s in range(20)}
        assert len(outs) >= 10, strength


_keys = st.from_regex(r"[a-z]{1,5}(_[a-z]{1,5}){0,2}", fullmatch=True)
_dates = st.datetimes(min_value=datetime(1970, 1, 2), max_value=datetime(2100, 1, 1),
                      timezones=st.sampled_from([None, timezone.utc, timezone(timedelta(hours=5, minutes=30)),
                                                 timezone(timedelta(hours=-8))]))
_scalars = (st.none() | st.booleans() | st.integers(-10**12, 10**12)
            | st.floats(allow_nan=False, allow_infinity=False, width=64)
            | st.text(alphabet="abc xyz", max_size=8)
            | _dates.map(lambda d: d.isoformat()) | _dates.map(lambda d: d.date().isoformat())
            | _dates.map(lambda d: d.isoformat(sep=" ", timespec="minutes")))
_json = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_keys, inner, max_size=5),
                     max_leaves=25)


@settings(max_examples=150, deadline=None)
@given(result=_json, seed=st.integers(0, 2**63), strength=st.sampled_from(ENV_STRENGTHS))
def test_property_pure_and_meaning_preserving(result: object, seed: int, strength: str) -> None:
    before = json.dumps(result)
    out = perturb_result(result, seed=seed, strength=strength)
    assert json.dumps(result) == before
    again = perturb_result(json.loads(before), seed=seed, strength=strength)
    assert json.dumps(out.value) == json.dumps(again.value) and out.transforms == again.transforms
    assert _same(decode_result(out.value, result), result)

# ---------------------------------------------------------------------------- bad input


def test_bad_input() -> None:
    with pytest.raises(ValueError, match="unknown env strength"):
        perturb_result(ORDERS, seed=0, strength="extreme")
    with pytest.raises(ValueError, match="unknown env transform"):
        apply_transforms(ORDERS, ["shout"])
    with pytest.raises(ValueError, match="mutually exclusive"):
        apply_transforms(ORDERS, ["camel_case_keys", "kebab_case_keys"])
    with pytest.raises(TypeError, match=r"tuple at \$\.a\[1\]"):
        perturb_result({"a": [1, (2, 3)]}, seed=0)
    with pytest.raises(TypeError, match="non-string key"):
        perturb_result({1: "x"}, seed=0)
    with pytest.raises(TypeError, match="seed"):
        perturb_result(ORDERS, seed="1")
