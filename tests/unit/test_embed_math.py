import numpy as np
import pytest

from services.embed.embedder import folder_pooling, normalize, pool


def test_mean_pooling_ignores_padding() -> None:
    hidden = np.array([[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]]], dtype=np.float32)
    mask = np.array([[1, 1, 0]])
    assert pool(hidden, mask, "mean").tolist() == [[2.0, 3.0]]


def test_cls_pooling_takes_the_first_token() -> None:
    hidden = np.arange(12, dtype=np.float32).reshape(2, 3, 2)
    assert pool(hidden, np.ones((2, 3)), "cls").tolist() == [[0.0, 1.0], [6.0, 7.0]]


@pytest.mark.parametrize("pooling", ["mean", "cls", "none"])
def test_already_pooled_outputs_pass_through(pooling: str) -> None:
    pooled = np.array([[3.0, 4.0]], dtype=np.float32)
    assert pool(pooled, np.ones((1, 5)), pooling).tolist() == [[3.0, 4.0]]  # type: ignore[arg-type]


def test_normalize() -> None:
    assert normalize(np.array([[3.0, 4.0], [0.0, 0.0]])).tolist() == [[0.6, 0.8], [0.0, 0.0]]


def test_pooling_from_a_sentence_transformers_folder(tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert folder_pooling(str(tmp_path)) == "cls"  # nothing declared: CLS, as BGE models expect
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text('{"pooling_mode_mean_tokens": true}')
    assert folder_pooling(str(tmp_path)) == "mean"
