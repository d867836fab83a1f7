"""A GenerateRequest becomes the /inference/v1/generate body it stands for: set fields only (an unset one
takes vLLM's default, as an absent JSON key does), every kind of field carried over."""
from __future__ import annotations

import json

from protocol.grpc import pb2
from services.frontend.requests.grpc_body import token_in_body


def test_unset_fields_stay_out_of_the_body() -> None:
    body = json.loads(token_in_body(pb2.GenerateRequest(token_ids=[1, 2]), stream=False))
    assert body == {"token_ids": [1, 2], "sampling_params": {}, "stream": False, "return_text": False, "priority": 0}


def test_every_kind_of_field_is_carried() -> None:
    sp = pb2.SamplingParams(max_tokens=7, temperature=0.0, top_k=-1, seed=-5, stop=["a", "b"], stop_token_ids=[3],
                            ignore_eos=True, min_tokens=2, skip_special_tokens=False, logprobs=0, logit_bias={5: -1.5},
                            bad_words=["x"], stream_interval=4,
                            structured_outputs=pb2.StructuredOutputs(choice=pb2.ChoiceList(choices=["yes", "no"])))
    req = pb2.GenerateRequest(request_id="r", token_ids=[9], sampling_params=sp, return_text=True, cache_salt="",
                              priority=-3)
    body = json.loads(token_in_body(req, stream=True))
    assert body["sampling_params"] == {"max_tokens": 7, "temperature": 0.0, "top_k": -1, "seed": -5, "stop": ["a", "b"],
                                       "stop_token_ids": [3], "ignore_eos": True, "min_tokens": 2,
                                       "skip_special_tokens": False, "logprobs": 0, "logit_bias": {"5": -1.5},
                                       "bad_words": ["x"], "stream_interval": 4,
                                       "structured_outputs": {"choice": ["yes", "no"]}}
    assert body["cache_salt"] == "" and body["request_id"] == "r" and body["stream"] is True
    assert body["priority"] == -3 and body["return_text"] is True
    regex = pb2.GenerateRequest(sampling_params=pb2.SamplingParams(structured_outputs=pb2.StructuredOutputs(
        regex="[a-z]+")))
    assert json.loads(token_in_body(regex, stream=False))["sampling_params"] == {"structured_outputs":
                                                                               {"regex": "[a-z]+"}}
