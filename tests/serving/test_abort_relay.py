"""AbortRelay: an abort taken by any instance reaches the instance that owns the request."""

import threading

import pytest

from flint_backend.serving.abort_relay import AbortRelay, owner_of, socket_name


class Aborts:
    def __init__(self):
        self.keys, self.event = [], threading.Event()

    def __call__(self, key):
        self.keys.append(key)
        self.event.set()


@pytest.fixture
def relays():
    a_aborts, b_aborts = Aborts(), Aborts()
    a, b = AbortRelay("flint_model_0_0", a_aborts), AbortRelay("flint_model_0_1", b_aborts)
    yield (a, a_aborts), (b, b_aborts)
    a.close()
    b.close()


def test_keys_name_their_owner(relays):
    (a, _), (b, _) = relays
    assert a.key_prefix != b.key_prefix and a.key_prefix.startswith("flint_model_0_0@")
    assert owner_of(a.key_prefix + "0123abcd") == a.address
    assert owner_of("0123abcd") is None


def test_an_abort_for_another_instance_is_forwarded_to_it(relays):
    (a, a_aborts), (b, b_aborts) = relays
    a.route(b.key_prefix + "feed")
    assert b_aborts.event.wait(5) and b_aborts.keys == [b.key_prefix + "feed"]
    a.route(a.key_prefix + "beef")
    a.route("no-owner")  # a key of a single-instance server of old: handled where it lands
    assert a_aborts.keys == [a.key_prefix + "beef", "no-owner"] and b_aborts.keys == [b.key_prefix + "feed"]


def test_an_abort_for_a_gone_instance_is_dropped(relays):
    (a, a_aborts), _ = relays
    a.route("flint_model_9_9@999999999/feed")  # no such socket: logged, not raised
    assert a_aborts.keys == []


def test_instance_names_too_long_for_a_socket_are_refused():
    with pytest.raises(ValueError, match="too long"):
        socket_name("m" * 200 + "@1")
