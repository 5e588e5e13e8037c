"""Guided decoding: sampled outputs follow the JSON schema, end on a stop token, start after the
start token when one is given; a schema that cannot compile is refused naming guided_json."""

import json

import pytest

from flint_backend.engine.engine import RequestError
from flint_backend.engine.sampling_params import SamplingParams, SamplingParamsError
from flint_backend.tokenizer import load_tokenizer

from engine_cases import make_engine, run_to_completion

SCHEMA = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]},
                                           "n": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["answer", "n"], "additionalProperties": False}


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


def stop_ids(tokenizer):
    return [tokenizer.convert_tokens_to_ids(t) for t in ("<|endoftext|>", "<|user|>")]


def test_sampled_outputs_follow_the_schema_and_stop(tokenizer):
    engine = make_engine()
    stops = stop_ids(tokenizer)
    seqs = [engine.add_request([5, 6, 7 + seed], SamplingParams(temperature=1.0, seed=seed, max_tokens=40,
                                                                  guided_json=SCHEMA, stop_token_ids=stops))
            for seed in range(4)]
    unguided = engine.add_request([5, 6, 7], SamplingParams(temperature=1.0, seed=0, max_tokens=8))
    assert not any(map(engine.runner.can_launch_ahead, seqs))  # masked on the host
    run_to_completion(engine)
    answers = set()
    for seq in seqs:
        assert seq.finish_reason == "stop" and seq.output_ids[-1] in stops
        value = json.loads(tokenizer.decode(seq.output_ids[:-1]))
        assert set(value) == {"answer", "n"} and value["answer"] in ("yes", "no") and 0 <= value["n"] <= 99
        assert tokenizer.decode(seq.output_ids[:-1]) == json.dumps(value)  # one layout: no free whitespace
        answers.add(json.dumps(value))
    assert len(answers) > 1  # sampled, not forced to one answer
    with pytest.raises(json.JSONDecodeError):  # the same seed without the schema: free text
        json.loads(tokenizer.decode(unguided.output_ids))


def test_the_schema_applies_after_the_start_token(tokenizer):
    engine = make_engine()
    start = tokenizer.convert_tokens_to_ids("</think>")
    # the bias makes the start token (no JSON text) the greedy first token; after it the schema holds,
    # over the bias
    params = SamplingParams(temperature=0.0, max_tokens=40, guided_json=SCHEMA, guided_start_token_id=start,
                            stop_token_ids=stop_ids(tokenizer), logit_bias={start: 100.0})
    seq = engine.add_request([5, 6, 7], params)
    run_to_completion(engine)
    assert seq.output_ids[0] == start and start not in seq.output_ids[1:]
    assert set(json.loads(tokenizer.decode(seq.output_ids[1:-1]))) == {"answer", "n"}
    assert seq.finish_reason == "stop"


def test_bad_schemas_name_guided_json():
    engine = make_engine()
    with pytest.raises(RequestError, match="^guided_json: not a JSON schema xgrammar can compile"):
        engine.add_request([1, 2], SamplingParams(guided_json={"type": "nonsense"}))
    with pytest.raises(SamplingParamsError, match="^guided_json: got .*expected a JSON schema object"):
        SamplingParams(guided_json=["not", "a", "schema"])
    assert not engine.has_work()  # nothing admitted
