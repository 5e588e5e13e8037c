"""StopStringMatcher: stops split across deltas, overlapping stops, unicode, and a random check
against a plain search of the whole text."""

import random

import pytest

from flint_backend.chat.stop_strings import StopStringMatcher


def feed(stop, deltas):
    """(emitted pieces, the stop matched), with flush() at the end when no stop was reached first."""
    matcher = StopStringMatcher(stop)
    pieces = []
    for delta in deltas:
        text, stopped = matcher.push(delta)
        pieces.append(text)
        if stopped:
            return pieces, matcher.matched
    return pieces + [matcher.flush()], matcher.matched


def test_stop_inside_one_delta():
    assert feed(["END"], ["abcENDdef"]) == (["abc"], "END")


def test_stop_split_across_deltas():
    # "E" and "EN" could start "END", so they wait; "x" cannot, so it goes at once
    assert feed(["END"], ["abcE", "N", "Dxyz"]) == (["abc", "", ""], "END")
    assert feed(["END"], ["x", "E", "N", "X", "y"]) == (["x", "", "", "ENX", "y", ""], None)


def test_ordinary_text_is_not_held():
    assert feed(["###"], ["Hello", " world", "!"]) == (["Hello", " world", "!", ""], None)


def test_text_that_looked_like_a_stop_is_flushed():
    assert feed(["END"], ["abcEN"]) == (["abc", "EN"], None)


def test_earliest_stop_wins():
    assert feed(["world", "o w"], ["hello world"]) == (["hell"], "o w")
    # same start: the earlier in the list
    assert feed(["ab", "abc"], ["xabc"]) == (["x"], "ab")
    assert feed(["abc", "ab"], ["xabc"]) == (["x"], "abc")


def test_overlapping_stops_split_across_deltas():
    # after "aab" the stop "ab" is complete, but "aabb" starts earlier and may still come;
    # "aaba" rules it out
    assert feed(["aabb", "ab"], ["a", "a", "b", "a"]) == (["", "", "", "a"], "ab")
    assert feed(["aabb", "ab"], ["a", "ab", "b"]) == (["", "", ""], "aabb")
    # "y" is complete but "xyz" started earlier and may still complete: wait for it
    assert feed(["xyz", "y"], ["x", "y", "z"]) == (["", "", ""], "xyz")
    assert feed(["xyz", "y"], ["x", "y", "!"]) == (["", "", "x"], "y")
    assert feed(["xyz", "y"], ["x", "y"]) == (["", "", "x"], "y")  # decided at the end, by flush()


def test_unicode_stops():
    assert feed(["。", "😀"], ["東京", "は晴れ😀です"]) == (["東京", "は晴れ"], "😀")
    assert feed(["終わり"], ["これで終", "わり。"]) == (["これで", ""], "終わり")


def test_nothing_after_a_stop():
    matcher = StopStringMatcher(["x"])
    assert matcher.push("axb") == ("a", True)
    assert matcher.push("more") == ("", True)
    assert matcher.flush() == ""
    assert matcher.stopped and matcher.matched == "x"


def test_no_stops_passes_everything():
    assert feed(None, ["a", "b"]) == (["a", "b", ""], None)
    assert feed([], ["a"]) == (["a", ""], None)


@pytest.mark.parametrize("bad", [[""], ["ok", 3]])
def test_bad_stop_is_an_error(bad):
    with pytest.raises(ValueError, match=r"stop\[\d\]: expected a non-empty string"):
        StopStringMatcher(bad)


def test_random_splits_agree_with_a_plain_search():
    rng = random.Random(0)
    alphabet = "ab東😀 "
    for _ in range(500):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 30)))
        stops = ["".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 5))) for _ in range(rng.randrange(1, 4))]
        cuts = sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, rng.randrange(0, 6))))
        deltas = [text[i:j] for i, j in zip([0] + cuts, cuts + [len(text)])]
        pieces, matched = feed(stops, deltas)
        hits = [(text.find(s), n) for n, s in enumerate(stops) if s in text]
        if hits:
            start, n = min(hits)
            assert ("".join(pieces), matched) == (text[:start], stops[n])
        else:
            assert ("".join(pieces), matched) == (text, None)
