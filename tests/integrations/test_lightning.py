"""Lightning with a kiln-compiled module, as its users write one: losses equal an uncompiled run's.

Lightning has no backend option of its own: its users compile the LightningModule with
`torch.compile(module, backend=...)` and hand the result to `Trainer.fit`, which unwraps
torch's `OptimizedModule` (`_orig_mod`) and re-wraps the module's forward and step methods with
the compiled module's `dynamo_ctx`. So `torch.compile(module, backend="kiln")` is how Lightning
selects kiln by name, and it works. `kiln.compile(module)` is an `OptimizedModule` too, with a
`dynamo_ctx` that compiles a method as kiln compiled the module, and works the same way.
"""
from __future__ import annotations

import pytest
import torch

import kiln
from kiln.frontend import stats as frontend_stats

lightning = pytest.importorskip("lightning", reason="lightning is not installed (scripts/env.sh installs it)")


class Regressor(lightning.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.GELU(), torch.nn.LayerNorm(32),
                                       torch.nn.Linear(32, 1))
        self.losses: list[float] = []

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_index):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self(x), y)
        self.losses.append(loss.item())
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


def fit(compile_with) -> tuple[list[float], object]:
    torch.manual_seed(0)
    module = Regressor()
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(64, 8, generator=generator)
    data = torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True).sin())
    loader = torch.utils.data.DataLoader(data, batch_size=16, num_workers=0)
    model = compile_with(module) if compile_with is not None else module
    trainer = lightning.Trainer(max_steps=5, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                                enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, loader)
    return module.losses, model


@pytest.mark.parametrize("how", ["kiln.compile", "torch.compile(backend='kiln')"])
def test_lightning_fits_a_kiln_compiled_module(how, tmp_path):
    eager_losses, _ = fit(None)
    torch._dynamo.reset()
    dump = {"debug": True, "debug_dir": str(tmp_path)}  # KILN_DEBUG: each graph kiln compiles leaves its files
    compile_with = ((lambda m: kiln.compile(m, options=dump)) if how == "kiln.compile"
                    else (lambda m: torch.compile(m, backend="kiln", options=dump)))
    # A graph kiln cannot compile fails the test rather than run eagerly. Strict mode also refuses graph
    # breaks in kiln's frontend (training_step's loss.item() is one), so there the checks are that no frame
    # ran eagerly and no graph fell back (a fallback.txt in the dumps).
    eager_frames = frontend_stats.eager_frames
    with kiln.config.patch(strict=how != "kiln.compile"):
        kiln_losses, model = fit(compile_with)
    assert frontend_stats.eager_frames == eager_frames
    assert not list(tmp_path.rglob("fallback.txt"))
    assert len(kiln_losses) == len(eager_losses) == 5
    assert kiln_losses == pytest.approx(eager_losses, rel=1e-4, abs=1e-6)
    assert isinstance(model, torch._dynamo.eval_frame.OptimizedModule)
    # kiln compiled the training step's graphs (forward and backward) into kernels
    assert len(list(tmp_path.rglob("wrapper.py"))) >= 2 and list(tmp_path.rglob("kernel_*"))
