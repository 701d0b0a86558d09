"""A sweep (outside CI) of Hugging Face model families beyond tests/models/test_hf_models.py, in their default
configs with tiny sizes, through kiln.compile: results against eager, graphs, breaks, frames run eagerly.

    python -m tests.models.sweep_families [--train] [family ...]

Inference runs under torch.no_grad(); --train runs forward + backward of the sum of the outputs in train mode,
dropout on (both runs seeded alike: kiln draws eager's masks), and compares every gradient too.
"""
import copy, sys, traceback, time, numpy, torch, transformers, kiln
from kiln.debug.explain import ExplainReport, _recording
from kiln.testing import compare
torch.manual_seed(0)
T = transformers
B, S, V = 2, 12, 96
small = dict(hidden_size=32, num_attention_heads=4, num_hidden_layers=2, intermediate_size=64, vocab_size=V)
def ids(): return torch.randint(3, V, (B, S))
CASES = {
 "roberta": lambda: (T.RobertaModel(T.RobertaConfig(**small)), dict(input_ids=ids())),
 "distilbert": lambda: (T.DistilBertModel(T.DistilBertConfig(dim=32, n_heads=4, n_layers=2, hidden_dim=64, vocab_size=V)), dict(input_ids=ids())),
 "albert": lambda: (T.AlbertModel(T.AlbertConfig(embedding_size=16, **small)), dict(input_ids=ids())),
 "electra": lambda: (T.ElectraModel(T.ElectraConfig(embedding_size=16, **small)), dict(input_ids=ids())),
 "deberta_v2": lambda: (T.DebertaV2Model(T.DebertaV2Config(**small)), dict(input_ids=ids())),
 "opt": lambda: (T.OPTForCausalLM(T.OPTConfig(hidden_size=32, num_attention_heads=4, num_hidden_layers=2, ffn_dim=64, vocab_size=V, word_embed_proj_dim=32)), dict(input_ids=ids())),
 "bloom": lambda: (T.BloomForCausalLM(T.BloomConfig(hidden_size=32, n_head=4, n_layer=2, vocab_size=V)), dict(input_ids=ids())),
 "falcon": lambda: (T.FalconForCausalLM(T.FalconConfig(hidden_size=32, num_attention_heads=4, num_hidden_layers=2, vocab_size=V)), dict(input_ids=ids())),
 "phi": lambda: (T.PhiForCausalLM(T.PhiConfig(**small)), dict(input_ids=ids())),
 "gemma": lambda: (T.GemmaForCausalLM(T.GemmaConfig(head_dim=8, num_key_value_heads=2, **small)), dict(input_ids=ids())),
 "qwen3": lambda: (T.Qwen3ForCausalLM(T.Qwen3Config(head_dim=8, num_key_value_heads=2, **small)), dict(input_ids=ids())),
 "gptj": lambda: (T.GPTJForCausalLM(T.GPTJConfig(n_embd=32, n_head=4, n_layer=2, rotary_dim=4, vocab_size=V)), dict(input_ids=ids())),
 "gpt_bigcode": lambda: (T.GPTBigCodeForCausalLM(T.GPTBigCodeConfig(n_embd=32, n_head=4, n_layer=2, vocab_size=V)), dict(input_ids=ids())),
 "mixtral": lambda: (T.MixtralForCausalLM(T.MixtralConfig(num_key_value_heads=2, num_local_experts=4, **small)), dict(input_ids=ids())),
 "mbart": lambda: (T.MBartForConditionalGeneration(T.MBartConfig(d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, vocab_size=V)), dict(input_ids=ids(), decoder_input_ids=ids())),
 "pegasus": lambda: (T.PegasusForConditionalGeneration(T.PegasusConfig(d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, vocab_size=V)), dict(input_ids=ids(), decoder_input_ids=ids())),
 "swin": lambda: (T.SwinModel(T.SwinConfig(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 2], window_size=4)), dict(pixel_values=torch.randn(B, 3, 32, 32))),
 "convnext": lambda: (T.ConvNextModel(T.ConvNextConfig(hidden_sizes=[8, 16, 16, 16], depths=[1, 1, 1, 1], num_channels=3, image_size=32)), dict(pixel_values=torch.randn(B, 3, 32, 32))),
 "resnet_hf": lambda: (T.ResNetModel(T.ResNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1])), dict(pixel_values=torch.randn(B, 3, 32, 32))),
 "deit": lambda: (T.DeiTModel(T.DeiTConfig(image_size=32, patch_size=8, **{k: v for k, v in small.items() if k != "vocab_size"})), dict(pixel_values=torch.randn(B, 3, 32, 32))),
 "wav2vec2": lambda: (T.Wav2Vec2Model(T.Wav2Vec2Config(conv_dim=(8, 8), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=8, num_conv_pos_embedding_groups=2, **{k: v for k, v in small.items() if k != "vocab_size"})), dict(input_values=torch.randn(B, 800))),
 "segformer": lambda: (T.SegformerModel(T.SegformerConfig(num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[8, 16], num_attention_heads=[1, 2], patch_sizes=[7, 3], strides=[4, 2], mlp_ratios=[2, 2], decoder_hidden_size=16)), dict(pixel_values=torch.randn(B, 3, 32, 32))),
}
train = '--train' in sys.argv


def _backward(output):
    leaves = torch.utils._pytree.tree_leaves(output.to_tuple() if hasattr(output, "to_tuple") else output)
    sum(leaf.float().sum() for leaf in leaves if isinstance(leaf, torch.Tensor) and leaf.requires_grad).backward()


only = [a for a in sys.argv[1:] if a != '--train'] or list(CASES)
for name in only:
    t0 = time.time()
    try:
        torch.manual_seed(0)
        model, inputs = CASES[name]()
        if train:
            model.train()
            reference = copy.deepcopy(model)
            torch.manual_seed(1234)  # kiln's dropout draws eager's masks from torch's generator, in eager's order
            numpy.random.seed(1234)  # Wav2Vec2's time masks are drawn by numpy
            expected = reference(**inputs)
            _backward(expected)
            report = ExplainReport()
            with _recording(report):
                torch.manual_seed(1234)
                numpy.random.seed(1234)
                actual = kiln.compile(model)(**inputs)
                _backward(actual)
            grads_e = [p.grad for p in reference.parameters() if p.grad is not None]
            grads_a = [p.grad for p in model.parameters() if p.grad is not None]
        else:
            model.eval()
            with torch.no_grad():
                expected = model(**inputs)
                report = ExplainReport()
                with _recording(report):
                    compiled = kiln.compile(model)
                    actual = compiled(**inputs)
            grads_e = grads_a = []
        leaves_e = [t for t in torch.utils._pytree.tree_leaves(expected.to_tuple() if hasattr(expected, "to_tuple") else expected) if isinstance(t, torch.Tensor)]
        leaves_a = [t for t in torch.utils._pytree.tree_leaves(actual.to_tuple() if hasattr(actual, "to_tuple") else actual) if isinstance(t, torch.Tensor)]
        leaves_e, leaves_a = leaves_e + grads_e, leaves_a + grads_a
        ok = len(leaves_e) == len(leaves_a) and len(grads_e) == len(grads_a) and \
            all(e.shape == a.shape and torch.allclose(e.float(), a.float(), atol=1e-4, rtol=1e-3) for e, a in zip(leaves_e, leaves_a))
        fallbacks = [g.fallback for g in report.graphs if g.fallback]
        eager = [f.eager_reason for f in report.frames if f.eager_reason]
        print(f"{name:12s} ok={ok} graphs={len(report.graphs)} breaks={len(report.breaks)} eager={len(eager)} fallbacks={len(fallbacks)} {time.time()-t0:.1f}s", flush=True)
        for b in report.breaks[:3]: print("   break:", b.reason[:150], "@", b.location)
        for e in eager[:2]: print("   eager:", e[:200])
        for f in fallbacks[:2]: print("   fallback:", f[:200])
        if not ok:
            for i, (e, a) in enumerate(zip(leaves_e, leaves_a)):
                if e.shape != a.shape or not torch.allclose(e.float(), a.float(), atol=1e-4, rtol=1e-3):
                    print("   MISMATCH leaf", i, e.shape, a.shape, (e.float() - a.float()).abs().max().item() if e.shape == a.shape else "")
    except Exception as error:
        print(f"{name:12s} CRASH {type(error).__name__}: {str(error)[:300]}", flush=True)
        traceback.print_exc(limit=3)
