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

 # the second batch (2026-12-04)
 "gpt_neo": lambda: (T.GPTNeoForCausalLM(T.GPTNeoConfig(hidden_size=32, num_heads=4, num_layers=2, attention_types=[[["global", "local"], 1]], window_size=4, vocab_size=V)), dict(input_ids=ids())),
 "codegen": lambda: (T.CodeGenForCausalLM(T.CodeGenConfig(n_embd=32, n_head=4, n_layer=2, rotary_dim=4, vocab_size=V)), dict(input_ids=ids())),
 "stablelm": lambda: (T.StableLmForCausalLM(T.StableLmConfig(num_key_value_heads=2, **small)), dict(input_ids=ids())),
 "starcoder2": lambda: (T.Starcoder2ForCausalLM(T.Starcoder2Config(num_key_value_heads=2, **small)), dict(input_ids=ids())),
 "olmo": lambda: (T.OlmoForCausalLM(T.OlmoConfig(**small)), dict(input_ids=ids())),
 "phi3": lambda: (T.Phi3ForCausalLM(T.Phi3Config(num_key_value_heads=2, pad_token_id=0, **small)), dict(input_ids=ids())),
 "gemma2": lambda: (T.Gemma2ForCausalLM(T.Gemma2Config(head_dim=8, num_key_value_heads=2, **small)), dict(input_ids=ids())),
 "qwen2_moe": lambda: (T.Qwen2MoeForCausalLM(T.Qwen2MoeConfig(num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32, **small)), dict(input_ids=ids())),
 "xglm": lambda: (T.XGLMForCausalLM(T.XGLMConfig(d_model=32, attention_heads=4, num_layers=2, ffn_dim=64, vocab_size=V)), dict(input_ids=ids())),
 "marian": lambda: (T.MarianMTModel(T.MarianConfig(d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, vocab_size=V, decoder_start_token_id=0, pad_token_id=1)), dict(input_ids=ids(), decoder_input_ids=ids())),
 "blenderbot": lambda: (T.BlenderbotForConditionalGeneration(T.BlenderbotConfig(d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, vocab_size=V)), dict(input_ids=ids(), decoder_input_ids=ids())),
 "mt5": lambda: (T.MT5ForConditionalGeneration(T.MT5Config(d_model=32, d_kv=8, d_ff=64, num_layers=1, num_decoder_layers=1, num_heads=4, vocab_size=V)), dict(input_ids=ids(), decoder_input_ids=ids())),
 "led": lambda: (T.LEDForConditionalGeneration(T.LEDConfig(d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, vocab_size=V, attention_window=[4])), dict(input_ids=ids(), decoder_input_ids=ids())),
 "m2m_100": lambda: (T.M2M100ForConditionalGeneration(T.M2M100Config(d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, vocab_size=V)), dict(input_ids=ids(), decoder_input_ids=ids())),
 "xlm_roberta": lambda: (T.XLMRobertaModel(T.XLMRobertaConfig(**small)), dict(input_ids=ids())),
 "mpnet": lambda: (T.MPNetModel(T.MPNetConfig(**small)), dict(input_ids=ids())),
 "funnel": lambda: (T.FunnelModel(T.FunnelConfig(d_model=32, n_head=4, d_head=8, d_inner=64, block_sizes=[1, 1], vocab_size=V)), dict(input_ids=ids())),
 "squeezebert": lambda: (T.SqueezeBertModel(T.SqueezeBertConfig(embedding_size=32, **small)), dict(input_ids=ids())),
 "mobilebert": lambda: (T.MobileBertModel(T.MobileBertConfig(hidden_size=32, embedding_size=16, intra_bottleneck_size=16, true_hidden_size=16, num_attention_heads=4, num_hidden_layers=2, intermediate_size=64, vocab_size=V)), dict(input_ids=ids())),
 "convbert": lambda: (T.ConvBertModel(T.ConvBertConfig(embedding_size=32, **small)), dict(input_ids=ids())),
 "big_bird": lambda: (T.BigBirdModel(T.BigBirdConfig(**small)), dict(input_ids=ids())),
 "xlnet": lambda: (T.XLNetModel(T.XLNetConfig(d_model=32, n_head=4, d_inner=64, n_layer=2, vocab_size=V)), dict(input_ids=ids())),
 "fnet": lambda: (T.FNetModel(T.FNetConfig(**{k: v for k, v in small.items() if k != "num_attention_heads"})), dict(input_ids=ids())),
 "canine": lambda: (T.CanineModel(T.CanineConfig(hidden_size=32, num_attention_heads=4, num_hidden_layers=2, intermediate_size=64, num_hash_buckets=64, local_transformer_stride=4, downsampling_rate=4)), dict(input_ids=torch.randint(3, 1000, (B, 16)))),
 "beit": lambda: (T.BeitModel(T.BeitConfig(image_size=32, patch_size=8, **{k: v for k, v in small.items() if k != "vocab_size"})), dict(pixel_values=torch.randn(B, 3, 32, 32))),
 "dinov2": lambda: (T.Dinov2Model(T.Dinov2Config(image_size=32, patch_size=8, **{k: v for k, v in small.items() if k not in ("vocab_size", "intermediate_size")})), dict(pixel_values=torch.randn(B, 3, 32, 32))),
 "vit_mae": lambda: (T.ViTMAEModel(T.ViTMAEConfig(image_size=32, patch_size=8, **{k: v for k, v in small.items() if k != "vocab_size"})), dict(pixel_values=torch.randn(B, 3, 32, 32))),
 "mobilevit": lambda: (T.MobileViTModel(T.MobileViTConfig(image_size=32, hidden_sizes=[16, 16, 16], neck_hidden_sizes=[8, 8, 16, 16, 16, 32, 64])), dict(pixel_values=torch.randn(B, 3, 32, 32))),
 "efficientnet": lambda: (T.EfficientNetModel(T.EfficientNetConfig(image_size=32, width_coefficient=1.0, depth_coefficient=0.1, hidden_dim=1280)), dict(pixel_values=torch.randn(B, 3, 32, 32))),
 "regnet": lambda: (T.RegNetModel(T.RegNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], groups_width=8)), dict(pixel_values=torch.randn(B, 3, 32, 32))),
 "levit": lambda: (T.LevitModel(T.LevitConfig(image_size=32, hidden_sizes=[16, 32, 48], num_attention_heads=[1, 2, 3], depths=[1, 1, 1], key_dim=[8, 8, 8])), dict(pixel_values=torch.randn(B, 3, 32, 32))),
 "poolformer": lambda: (T.PoolFormerModel(T.PoolFormerConfig(hidden_sizes=[8, 16, 16, 16], depths=[1, 1, 1, 1])), dict(pixel_values=torch.randn(B, 3, 32, 32))),
 "convnextv2": lambda: (T.ConvNextV2Model(T.ConvNextV2Config(hidden_sizes=[8, 16, 16, 16], depths=[1, 1, 1, 1])), dict(pixel_values=torch.randn(B, 3, 32, 32))),
 "hubert": lambda: (T.HubertModel(T.HubertConfig(conv_dim=(8, 8), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=8, num_conv_pos_embedding_groups=2, **{k: v for k, v in small.items() if k != "vocab_size"})), dict(input_values=torch.randn(B, 800))),
 "wavlm": lambda: (T.WavLMModel(T.WavLMConfig(conv_dim=(8, 8), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=8, num_conv_pos_embedding_groups=2, **{k: v for k, v in small.items() if k != "vocab_size"})), dict(input_values=torch.randn(B, 800))),
 "speech_to_text": lambda: (T.Speech2TextForConditionalGeneration(T.Speech2TextConfig(d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, vocab_size=V, input_feat_per_channel=16, conv_channels=16)), dict(input_features=torch.randn(B, 40, 16), decoder_input_ids=ids())),
 "siglip": lambda: (T.SiglipVisionModel(T.SiglipVisionConfig(image_size=32, patch_size=8, **{k: v for k, v in small.items() if k != "vocab_size"})), dict(pixel_values=torch.randn(B, 3, 32, 32))),
 "mamba": lambda: (T.MambaForCausalLM(T.MambaConfig(hidden_size=32, state_size=4, num_hidden_layers=2, vocab_size=V)), dict(input_ids=ids())),
 "rwkv": lambda: (T.RwkvForCausalLM(T.RwkvConfig(hidden_size=32, attention_hidden_size=32, intermediate_size=64, num_hidden_layers=2, vocab_size=V, context_length=32)), dict(input_ids=ids())),
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
                torch.manual_seed(1234)  # ViTMAE draws its patch mask in eval mode too: both runs draw alike
                expected = model(**inputs)
                report = ExplainReport()
                with _recording(report):
                    compiled = kiln.compile(model)
                    torch.manual_seed(1234)
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
