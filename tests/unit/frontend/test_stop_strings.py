"""StopChecker: what a client sees of a stream cut by stop strings, however the text was split."""

from __future__ import annotations

import random

import pytest

from services.frontend.text.stop_strings import MAX_STOP_CHARS, MAX_STOP_STRINGS, StopChecker


def run(stops: list[str], deltas: list[str], *, include: bool = False) -> tuple[list[str], str | None]:
    """Emitted pieces per push (then flush's, when nothing matched) and the matched stop."""
    checker = StopChecker(stops, include_stop_str_in_output=include)
    emitted = []
    for delta in deltas:
        text, matched = checker.push(delta)
        emitted.append(text)
        if matched is not None:
            return emitted, matched
    emitted.append(checker.flush())
    return emitted, None


def test_a_stop_split_across_deltas_is_held_then_cut() -> None:
    assert run(["STOP"], ["Hello ST", "O", "P and more"]) == (["Hello ", "", ""], "STOP")


def test_a_false_start_is_released_when_it_stops_matching() -> None:
    assert run(["abc"], ["ab", "x", "abc", "tail"]) == (["", "abx", ""], "abc")


def test_held_back_text_is_released_on_mismatch_and_at_flush() -> None:
    assert run(["</answer>"], ["4", "2</", "ans", "wer? no", " </an"]) == (
        ["4", "2", "", "</answer? no", " ", "</an"], None)


def test_nothing_after_the_stop_is_emitted_and_later_pushes_are_empty() -> None:
    checker = StopChecker(["\n\n"])
    assert checker.push("one\n\ntwo") == ("one", "\n\n")
    assert checker.push("three") == ("", "\n\n")
    assert checker.flush() == ""
    assert checker.matched == "\n\n"


def test_the_first_stop_to_complete_wins_not_the_first_to_start() -> None:
    # "b" completes at the 2nd char, "abc" at the 3rd: the same answer whether streamed or not.
    assert run(["abc", "b"], ["abc"]) == (["a"], "b")
    assert run(["abc", "b"], ["a", "b", "c"]) == (["", "a"], "b")


def test_a_stop_that_is_a_prefix_of_another() -> None:
    assert run(["ab", "abcd"], ["xa", "bcd"]) == (["x", ""], "ab")
    assert run(["abcd", "ab"], ["xab"]) == (["x"], "ab")


def test_stops_completing_together_prefer_the_longer() -> None:
    assert run(["bc", "abc"], ["xab", "c"]) == (["x", ""], "abc")


def test_overlapping_stops_hold_the_longest_possible_start() -> None:
    # "aab" could start at either "a": both are held until it cannot match.
    assert run(["aab", "abz"], ["xa", "a", "c", "d"]) == (["x", "", "aac", "d", ""], None)
    assert run(["aab", "abz"], ["xa", "a", "bz"]) == (["x", "", ""], "aab")


def test_include_stop_str_in_output_emits_the_stop_and_nothing_after() -> None:
    assert run(["abc"], ["ab", "x", "ab", "cde"], include=True) == (["ab", "x", "ab", "c"], "abc")
    assert run(["abc"], ["zzab", "q"], include=True) == (["zzab", "q", ""], None)


def test_multibyte_stops() -> None:
    assert run(["停止"], ["你好停", "止了"]) == (["你好", ""], "停止")
    assert run(["停止"], ["你好停", "下"]) == (["你好", "停下", ""], None)
    assert run(["🎉!"], ["yay🎉", "🎉", "!x"]) == (["yay", "🎉", ""], "🎉!")


def test_no_stops_means_no_holdback() -> None:
    checker = StopChecker([])
    for delta in ["a", "<", "</", "\n"]:
        assert checker.push(delta) == (delta, None)
    assert checker.flush() == ""


def test_single_character_stops_need_no_holdback() -> None:
    assert run(["\n"], ["ab", "cd\nef"]) == (["ab", "cd"], "\n")


@pytest.mark.parametrize("bad", [[""], ["ok", ""]])
def test_empty_stop_strings_are_refused(bad: list[str]) -> None:
    with pytest.raises(ValueError, match=r"stop\[\d\]"):
        StopChecker(bad)


def _reference(stops: list[str], text: str, include: bool) -> tuple[str, str | None]:
    """Grow the text one character at a time; stop at the first stop to complete (longest on ties)."""
    for end in range(1, len(text) + 1):
        done = [s for s in stops if text[:end].endswith(s)]
        if done:
            stop = max(done, key=len)
            return text[:end] if include else text[:end - len(stop)], stop
    return text, None


@pytest.mark.parametrize("include", [False, True])
def test_any_split_of_the_text_gives_the_same_result_as_the_reference(include: bool) -> None:
    rng = random.Random(11 + include)
    alphabet = "ab中c"
    for _ in range(1500):
        stops = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 4)))
                 for _ in range(rng.randint(1, 3))]
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 24)))
        cuts = sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, rng.randint(0, 8))))
        deltas = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        emitted, matched = run(stops, deltas, include=include)
        assert ("".join(emitted), matched) == _reference(stops, text, include), (stops, deltas)


def test_only_a_possible_start_of_a_stop_is_held_back() -> None:
    rng = random.Random(5)
    for _ in range(1500):
        stops = ["".join(rng.choice("ab中") for _ in range(rng.randint(1, 4))) for _ in range(2)]
        checker, pushed, emitted = StopChecker(stops), "", ""
        for _ in range(rng.randint(1, 10)):
            delta = "".join(rng.choice("ab中c") for _ in range(rng.randint(0, 3)))
            text, matched = checker.push(delta)
            pushed, emitted = pushed + delta, emitted + text
            if matched is not None:
                break
            held = pushed[len(emitted):]
            assert pushed.startswith(emitted)
            # The longest tail that is a proper prefix of a stop: no more, no less.
            longest = max((n for n in range(len(pushed) + 1)
                           if any(s.startswith(pushed[len(pushed) - n:]) and n < len(s) for s in stops)),
                          default=0)
            assert len(held) == longest, (stops, pushed, emitted)


def test_a_5000_character_stop_is_held_while_it_can_match_and_cut_when_it_does() -> None:
    # The regex over every prefix that this replaced took seconds here (quadratic in the length).
    rng = random.Random(3)
    stop = "".join(rng.choice("ab ") for _ in range(4999)) + "!"
    checker = StopChecker([stop])
    deltas = ["text: ", *(stop[i:i + 3] for i in range(0, len(stop) - 1, 3))]
    deltas[-1] = deltas[-1].removesuffix("!")
    assert [checker.push(d) for d in deltas] == [("text: ", None)] + [("", None)] * (len(deltas) - 1)
    assert checker.push("!after") == ("", stop)
    missed = StopChecker([stop])
    assert missed.push(stop[:-1]) == ("", None) and missed.push("?") == (stop[:-1] + "?", None)


def test_the_largest_allowed_stop_list_is_prepared_and_matched() -> None:
    rng = random.Random(7)
    size = MAX_STOP_CHARS // MAX_STOP_STRINGS
    stops = ["".join(rng.choice("abc") for _ in range(size)) for _ in range(MAX_STOP_STRINGS)]
    assert sum(map(len, stops)) == MAX_STOP_CHARS
    target = stops[-1]
    # A text that runs along most of several stops before the one it completes.
    text = "".join(s[: size // 2] for s in stops[:8]) + target + "tail"
    for include in (False, True):
        emitted, matched = run(stops, [text[i:i + 4] for i in range(0, len(text), 4)], include=include)
        assert (("".join(emitted), matched)
                == _reference(stops, text, include)
                == (text[:text.index(target) + (size if include else 0)], target))


def test_stops_sharing_long_prefixes_and_nested_in_each_other() -> None:
    stops = ["x" * 300 + "a", "x" * 300 + "b", "x" * 200, "x" * 300, "yx" * 100 + "z"]
    rng = random.Random(2)
    for _ in range(200):
        text = "".join(rng.choice(["x" * rng.randint(1, 120), "a", "b", "yx" * rng.randint(1, 60), "z"])
                       for _ in range(rng.randint(1, 12)))
        cuts = sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, 6)))
        deltas = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        emitted, matched = run(stops, deltas)
        assert ("".join(emitted), matched) == _reference(stops, text, False), (stops, deltas)
