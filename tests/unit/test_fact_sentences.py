"""memchat.usecases.recall.facts.fact_sentences: the extra recall keys of a user message."""

from __future__ import annotations

from memchat.usecases.recall.facts import fact_sentences, memory_sentences
from memchat.usecases.recall.follow_up import follow_up_query


def test_each_first_person_sentence_of_a_message_saying_several_things() -> None:
    text = (
        "I'm planning a trip to Miami. Can you find flights? By the way, my sister"
        " Ana got married last week! It was lovely."
    )
    assert fact_sentences(text) == [
        "I'm planning a trip to Miami.",
        "By the way, my sister Ana got married last week!",
    ]


def test_a_message_of_one_sentence_has_none() -> None:
    assert fact_sentences("I love long walks on the beach with my dog") == []
    assert fact_sentences("") == []


def test_too_short_too_long_and_repeated_sentences_are_left_out() -> None:
    long = "I " + "really " * 70 + "like it."
    text = f"I am. {long} I like tea a lot, honestly. I like tea a lot, honestly."
    assert fact_sentences(text) == ["I like tea a lot, honestly."]


def test_a_full_stop_without_a_capital_after_it_does_not_split() -> None:
    assert fact_sentences("I paid $3.50 for it. e.g. my cat likes it") == []


def test_a_short_follow_up_takes_the_previous_exchange() -> None:
    from memchat.messages import ai, human

    window = [human("my sister is Ana"), ai("Nice!"), human("she is a doctor"), ai("Great. " * 100)]
    assert follow_up_query("and her age?", window) == (
        "she is a doctor\n" + ("Great. " * 100)[:500] + "\nand her age?"
    )
    assert follow_up_query("how old is my sister now", window) is None
    assert follow_up_query("what is my favourite colour?", window) is None
    assert follow_up_query("what about Paris?", window) is not None
    assert follow_up_query("Why not?", window) is not None
    assert follow_up_query("why?", []) is None
    assert follow_up_query("ok", [ai("hello")]) is None


def test_memory_keeps_first_person_sentences_and_a_short_message_whole() -> None:
    assert memory_sentences("I love long walks on the beach with my dog") == [
        "I love long walks on the beach with my dog"
    ]
    text = "My sister Ana is a marine biologist. The sea is cold. We visit her in June."
    # The sentences first (their places stay), then the message whole.
    assert memory_sentences(f"  {text}\n") == [
        "My sister Ana is a marine biologist.",
        "We visit her in June.",
        text,
    ]
    # Past 400 characters: the sentences only.
    long = f"{text} " + "The reef there is old and the boats are slow to arrive. " * 7
    assert len(long) > 400
    assert memory_sentences(long) == [
        "My sister Ana is a marine biologist.",
        "We visit her in June.",
    ]
    # Nothing said of the speaker, or too short: nothing kept.
    assert memory_sentences("The weather there is grey most days.") == []
    assert memory_sentences("Thanks, I do.") == []
    # Only whole words count.
    assert memory_sentences("Iceland is windy and its tides are strong.") == []
