"""The demo LLMs' engine (tritongate/demo_models/llm_core.py) on the real SmolLM2 weights, in float32 on
the CPU as the demo runs here: a batch row's numbers do not depend on the other rows, so a greedy text is
the same alone and batched; beam search as the FasterTransformer and TensorRT-LLM demo models serve it,
against transformers' own beam search."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, DynamicCache

from tests.support.stack import DEMO_LLM
from tritongate.demo_models.llm_batch import Batch, row_attention
from tritongate.demo_models.llm_beams import BeamSearch, Hypothesis, beam_arrays
from tritongate.demo_models.llm_core import Engine, EngineOptions, Owner, RequestError, Sequence
from tritongate.demo_models.llm_linear import pack_linears
from tritongate.demo_models.llm_sampling import Sampling
from tritongate.demo_models.llm_trtllm import Inputs, TrtllmRequest, parse_items

PROMPTS = ["The capital of France is", "Once upon a time there was a small", "def fibonacci(n):", "1, 2, 3,"]


@pytest.fixture(scope="module")
def model(models_dir: Path) -> Any:
    """The model as the engine runs it (its matrix products packed where oneDNN is there)."""
    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(models_dir / DEMO_LLM, dtype=torch.float32,
                                                 attn_implementation=row_attention()).eval()
    pack_linears(model, 4)
    return model


@pytest.fixture(scope="module")
def plain(models_dir: Path) -> Any:
    """The model with torch's own matrix products."""
    return AutoModelForCausalLM.from_pretrained(models_dir / DEMO_LLM, dtype=torch.float32,
                                                attn_implementation=row_attention()).eval()


@pytest.fixture(scope="module")
def engine(models_dir: Path) -> Any:
    engine = Engine(str(models_dir / DEMO_LLM), name="test", log=lambda _: None,
                    options=EngineOptions(dtype="float32", max_active=4))
    yield engine
    engine.close()


def _prompt(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text).input_ids)


@pytest.mark.parametrize("products", ["as the engine runs them", "torch's, every step all rows"])
def test_a_rows_logits_are_bitwise_the_same_whatever_the_other_rows_hold(engine: Engine, model: Any, plain: Any,
                                                                        tokenizer: Any, products: str) -> None:
    """Each prompt decoded alone, then all four together in another row order: every step's logits of every
    row are identical bit for bit. As the engine batches here (oneDNN's products, only the used rows where
    its check at load found that safe), and as it falls back where that check fails (every step all rows)."""
    prompts = [_prompt(tokenizer, text) for text in PROMPTS]
    fixed = engine.batch.fixed if products == "as the engine runs them" else True
    model = model if products == "as the engine runs them" else plain

    def decode(order: list[int], steps: int = 5) -> dict[int, list[torch.Tensor]]:
        batch, logits = Batch(torch, DynamicCache, model.config, rows=4, fixed=fixed), {}
        with torch.inference_mode():
            for i in order:
                cache = DynamicCache(config=model.config)
                first = model(input_ids=torch.tensor([prompts[i]]), past_key_values=cache, use_cache=True)
                seq = Sequence(prompts[i], Sampling(max_new_tokens=steps + 1), Owner(), index=i)
                seq.tokens.append(int(first.logits[0, -1].argmax()))
                batch.add(seq, cache)
                logits[i] = []
            for _ in range(steps):
                step = batch.step(model)
                for row, seq in batch.used():
                    logits[seq.index].append(step[row])
                    seq.tokens.append(int(step[row].argmax()))
        return logits

    alone = {i: decode([i])[i] for i in range(len(prompts))}
    together = decode([3, 1, 0, 2])
    for i in range(len(prompts)):
        assert all(torch.equal(a, b) for a, b in zip(alone[i], together[i], strict=True)), PROMPTS[i]


class Collect(Owner):
    """Records what the engine hands a request; `done` is set when it ends."""

    def __init__(self) -> None:
        self.tokens: dict[int, list[int]] = {}
        self.beams: list[list[Hypothesis]] = []
        self.errors: list[str] = []
        self.aborted_with: list[str] = []
        self.cancel = False
        self.done = threading.Event()

    def aborted(self) -> str | None:
        return "cancelled" if self.cancel else None

    def on_token(self, seq: Sequence, reason: str | None) -> str | None:
        self.tokens[seq.index] = seq.new_tokens()
        if reason is not None:
            self.done.set()
        return reason

    def on_beams(self, search: BeamSearch) -> None:
        self.beams.append(search.best())
        if search.done:
            self.done.set()

    def on_abort(self, seq: Sequence, why: str) -> None:
        self.aborted_with.append(why)
        self.done.set()

    def on_error(self, seq: Sequence, message: str) -> None:
        self.errors.append(message)
        self.done.set()


def _run(engine: Engine, requests: list[tuple[list[int], Sampling]]) -> list[Collect]:
    owners = [Collect() for _ in requests]
    engine.submit([Sequence(prompt, sampling, owner) for (prompt, sampling), owner in zip(requests, owners,
                                                                                          strict=True)])
    for owner in owners:
        assert owner.done.wait(120)
    return owners


def test_a_greedy_text_is_the_same_alone_and_batched(engine: Engine, tokenizer: Any) -> None:
    requests = [(_prompt(tokenizer, text), Sampling(max_new_tokens=12, end_ids=(engine.eos_id,)))
                for text in PROMPTS]
    alone = [_run(engine, [request])[0].tokens[0] for request in requests]
    together = [owner.tokens[0] for owner in _run(engine, requests)]
    assert together == alone
    assert all(len(tokens) == 12 or tokens[-1] == engine.eos_id for tokens in alone)


def test_beam_search_finds_transformers_beams(engine: Engine, model: Any, tokenizer: Any) -> None:
    """Two beams, without an end id so both run to the length: the same tokens and scores as transformers'
    `generate(num_beams=2)`, best first, streamed every step."""
    prompt = _prompt(tokenizer, PROMPTS[1])
    owner = _run(engine, [(prompt, Sampling(max_new_tokens=6, beam_width=2))])[0]
    assert not owner.errors and len(owner.beams) == 6  # one report per step, the last final
    final = owner.beams[-1]
    assert [len(h.tokens) for h in final] == [6, 6] and final[0].tokens != final[1].tokens
    assert final[0].cum_logprob >= final[1].cum_logprob
    with torch.inference_mode():
        reference = model.generate(torch.tensor([prompt]), num_beams=2, num_return_sequences=2, max_new_tokens=6,
                                   do_sample=False, length_penalty=0.0, early_stopping=True, eos_token_id=None,
                                   pad_token_id=engine.eos_id, output_scores=True, return_dict_in_generate=True)
    assert [h.tokens for h in final] == [row[len(prompt):].tolist() for row in reference.sequences]
    assert [h.cum_logprob for h in final] == pytest.approx(reference.sequences_scores.tolist(), abs=1e-3)


def test_beams_that_reach_the_end_id_finish_and_the_best_come_first(engine: Engine, tokenizer: Any) -> None:
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "Say hi."}], add_generation_prompt=True,
                                         tokenize=False)
    sampling = Sampling(max_new_tokens=40, beam_width=3, end_ids=(engine.eos_id,), length_penalty=1.0)
    owner = _run(engine, [(_prompt(tokenizer, chat), sampling)])[0]
    assert not owner.errors
    final = owner.beams[-1]
    assert len(final) == 3 and len({tuple(h.tokens) for h in final}) == 3
    scores = [h.score(1.0) for h in final]
    assert scores == sorted(scores, reverse=True)
    assert any(h.reason == "stop" and h.tokens[-1] == engine.eos_id for h in final)
    arrays = beam_arrays(final, 3, prefix=[], keep_end=False, end_ids=(engine.eos_id,), pad=-1)
    ended = [k for k, h in enumerate(final) if h.reason == "stop"]
    assert all(int(arrays["sequence_length"][0, k]) == len(final[k].tokens) - 1 for k in ended)


def test_a_cancelled_beam_search_ends_once_and_frees_its_rows(engine: Engine, tokenizer: Any) -> None:
    owner = Collect()
    seq = Sequence(_prompt(tokenizer, PROMPTS[0]), Sampling(max_new_tokens=200, beam_width=4), owner)
    engine.submit([seq])
    while not owner.beams:
        owner.done.wait(0.05)
    owner.cancel = True
    assert owner.done.wait(60)
    # the other rows are free again: a greedy request still runs
    assert _run(engine, [(_prompt(tokenizer, PROMPTS[2]), Sampling(max_new_tokens=2))])[0].tokens[0]
    assert owner.aborted_with == ["cancelled"] and not owner.errors


def test_a_beam_search_wider_than_the_batch_is_refused(engine: Engine, tokenizer: Any) -> None:
    owner = _run(engine, [(_prompt(tokenizer, PROMPTS[0]), Sampling(max_new_tokens=2, beam_width=8))])[0]
    assert owner.errors == ["beam_width 8 exceeds the 4 sequences this model decodes together "
                            "(max_active_requests)"]


def _trtllm_items(max_beam_width: int = 4, **tensors: Any) -> list[Any]:
    inputs = Inputs(lambda name: tensors.get(name), batch_size=1)
    return parse_items(inputs, [[1, 2, 3]], end_id=None, exclude_input=False, vocab_size=100, max_positions=64,
                       max_beam_width=max_beam_width, compile_guide=lambda kind, guide: object())


def test_trtllm_beam_width_up_to_the_models_and_the_beams_it_returns() -> None:
    out_len = np.array([[8]], np.int32)
    [item] = _trtllm_items(request_output_len=out_len, beam_width=np.array([[3]], np.int32),
                           len_penalty=np.array([[1.0]], np.float32))
    assert (item.sampling.beam_width, item.sampling.length_penalty, item.num_return_sequences) == (3, 1.0, 3)
    [item] = _trtllm_items(request_output_len=out_len, beam_width=np.array([[3]], np.int32),
                           num_return_sequences=np.array([[2]], np.int32))
    assert item.num_return_sequences == 2
    for tensors, message in [({"beam_width": 5}, "max_beam_width is 4"),
                             ({"beam_width": 2, "num_return_sequences": 3}, "at most beam_width"),
                             ({"beam_width": 2, "guided_decoding_guide_type": b"json"}, "cannot be combined")]:
        with pytest.raises(RequestError, match=message):
            _trtllm_items(request_output_len=out_len, **{name: np.array([[v]]) for name, v in tensors.items()})
    with pytest.raises(RequestError, match="max_beam_width is 1"):  # the ensemble's: no beams
        _trtllm_items(1, request_output_len=out_len, beam_width=np.array([[2]], np.int32))


class _Responses(TrtllmRequest):
    def __init__(self, items: list[Any], streaming: bool) -> None:
        super().__init__(items, streaming=streaming, request_id="r", cancelled=lambda: False)
        self.sent: list[tuple[dict[str, np.ndarray], bool]] = []

    def emit(self, seq: Sequence, outputs: dict[str, np.ndarray], ended: bool, last: bool) -> None:
        self.sent.append((outputs, last))


def _search(request: Sequence, running: list[list[int]], finished: list[Hypothesis], done: bool) -> BeamSearch:
    search = BeamSearch(request)
    search.beams = []
    for tokens in running:
        beam = Sequence(request.prompt, request.sampling, request.owner)
        beam.tokens, beam.logprobs = request.prompt + tokens, [-1.0] * len(tokens)
        search.beams.append(beam)
    search.finished, search.done = finished, done
    return search


@pytest.mark.parametrize("streaming", [True, False])
def test_trtllm_beam_responses(streaming: bool) -> None:
    """Streamed: every step, each beam's generated tokens so far; otherwise one response with the prompt. The
    end id that finished a hypothesis is left out; shorter beams are padded with -1."""
    [item] = _trtllm_items(request_output_len=np.array([[8]], np.int32), beam_width=np.array([[2]], np.int32),
                           end_id=np.array([[2]], np.int32))
    owner = _Responses([item], streaming)
    [request] = owner.seqs
    owner.on_beams(_search(request, [[7, 8], [9, 10]], [], done=False))
    ended = Hypothesis([5, 2], [-0.5, -0.1], "stop")
    owner.on_beams(_search(request, [[7, 8, 11]], [ended], done=True))
    if streaming:
        (first, last_flag0), (final, last_flag1) = owner.sent
        assert first["output_ids"].tolist() == [[[7, 8], [9, 10]]] and first["sequence_length"].tolist() == [[2, 2]]
        assert not last_flag0
    else:
        [(final, last_flag1)] = owner.sent
    prompt = [] if streaming else [1, 2, 3]
    assert final["output_ids"].tolist() == [[[*prompt, 5, -1, -1], [*prompt, 7, 8, 11]]]  # best first: -0.6 > -3
    assert final["sequence_length"].tolist() == [[len(prompt) + 1, len(prompt) + 3]] and last_flag1
