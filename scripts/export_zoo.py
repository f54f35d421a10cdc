"""Export the model families people export (tiny configurations) with both of PyTorch's
exporters, import each file, and check every NumPy engine against ONNX Runtime on it.

    pip install torchvision==0.28.0 --no-deps transformers    # CPU, beside torch 2.13; not test deps
    python scripts/export_zoo.py                   # every family, both exporters; a Markdown table
    python scripts/export_zoo.py --only gpt2 --keep /tmp/zoo   # keep the .onnx files

Each model takes one float32 input with a dynamic batch axis: a classifier its image, a text
model its token embeddings (``inputs_embeds``: the importer takes one float32 input, so the
embedding lookup of integer ids stays outside), Whisper's encoder its log-mel features, wav2vec 2.0
its raw audio. Weights are the random initialisation of each tiny configuration. A file passes when it imports and every
NumPy engine matches ONNX Runtime on the original file to 1e-4 relative (to the largest output
magnitude) at batch 1, 3 and 4 (``--batches``), on fresh random inputs; the bytes tracemalloc sees over warm
forwards of the planned engines are reported beside. Nothing here is run by the tests.
The table is what docs/importing.md records.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import platform
import sys
import traceback
import types
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

import numpy as np  # noqa: E402

from engines import ENGINES, OnnxImportError, load_onnx  # noqa: E402

OWN = ["naive", "static", "arena", "fused", "packed", "onednn"]
RTOL = 1e-4
BATCHES = (1, 3, 4)             # --batches


def _torch():
    import torch
    torch.manual_seed(0)
    return torch


def _torchvision():
    # torchvision 0.28's wheel beside torch 2.13+cpu fails registering its C ops' meta kernels
    # (operator torchvision::nms does not exist); the classifiers need none of them.
    sys.modules.setdefault("torchvision._meta_registrations", types.ModuleType("torchvision._meta_registrations"))
    import torchvision
    return torchvision


def _transformers():
    _torchvision()                       # transformers imports torchvision when it is installed
    import transformers
    transformers.logging.set_verbosity_error()
    return transformers


class Embeds:
    """A text model taking float32 token embeddings (batch, seq, dim), returning its last hidden state;
    ``mask``: an attention mask (ones, the last two positions of every sample padded) held inside."""

    @staticmethod
    def wrap(model, seq: int, mask: bool):
        torch = _torch()

        class Wrapped(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.model = model
                m = torch.ones(1, seq, dtype=torch.int64)
                m[:, -2:] = 0
                self.register_buffer("mask", m)

            def forward(self, x):
                kwargs = {"attention_mask": self.mask.expand(x.shape[0], -1)} if mask else {}
                return self.model(inputs_embeds=x, **kwargs).last_hidden_state

        return Wrapped().eval()


# torchvision's classifiers: every one under 30 M parameters (torchvision 0.28's registry; 40), and
# the side of the square image each is exported at: 64 where the model takes it, more where it must
# (Inception v3's stem needs 75; ViT checks its image size; Swin's shifted windows want 224).
# vit_b_16 (86 M) stays as the one larger file, for ViT's own checks.
CLASSIFIERS = {
    **dict.fromkeys((
        "squeezenet1_0", "squeezenet1_1", "shufflenet_v2_x0_5", "shufflenet_v2_x1_0", "shufflenet_v2_x1_5",
        "shufflenet_v2_x2_0", "mnasnet0_5", "mnasnet0_75", "mnasnet1_0", "mnasnet1_3", "mobilenet_v2",
        "mobilenet_v3_small", "mobilenet_v3_large", "efficientnet_b0", "efficientnet_b1", "efficientnet_b2",
        "efficientnet_b3", "efficientnet_b4", "efficientnet_v2_s", "regnet_y_400mf", "regnet_y_800mf",
        "regnet_y_1_6gf", "regnet_y_3_2gf", "regnet_x_400mf", "regnet_x_800mf", "regnet_x_1_6gf",
        "regnet_x_3_2gf", "googlenet", "densenet121", "densenet161", "densenet169", "densenet201", "resnet18",
        "resnet34", "resnet50", "resnext50_32x4d", "convnext_tiny"), 64),
    "inception_v3": 96, "swin_t": 224, "swin_v2_t": 224, "vit_b_16": 224}


def classifier(name: str):
    """torchvision's ``name`` with random weights, in eval mode, and an input batch of 2."""
    torch = _torch()
    size = CLASSIFIERS[name]
    kwargs = {"aux_logits": False, "init_weights": False} if name in ("googlenet", "inception_v3") else {}
    model = getattr(_torchvision().models, name)(**kwargs).eval()
    if name == "vit_b_16":            # its head starts at zero: every output 0, nothing to compare
        torch.nn.init.normal_(model.heads.head.weight, std=0.02)
    return model, torch.randn(2, 3, size, size)


def gpt2(attn="sdpa"):
    transformers = _transformers()
    torch = _torch()
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=64, vocab_size=100,
                                     attn_implementation=attn)
    return Embeds.wrap(transformers.GPT2Model(config), 16, mask=False), torch.randn(2, 16, 64)


def bert(mask=True, attn="sdpa"):
    transformers = _transformers()
    torch = _torch()
    config = transformers.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=128, vocab_size=100, max_position_embeddings=64,
                                     attn_implementation=attn)
    return Embeds.wrap(transformers.BertModel(config, add_pooling_layer=False), 16, mask=mask), torch.randn(2, 16, 64)


def distilbert():
    transformers = _transformers()
    torch = _torch()
    config = transformers.DistilBertConfig(dim=64, n_layers=2, n_heads=4, hidden_dim=128, vocab_size=100,
                                           max_position_embeddings=64)
    return Embeds.wrap(transformers.DistilBertModel(config), 16, mask=True), torch.randn(2, 16, 64)


def t5_encoder(attn="sdpa"):
    transformers = _transformers()
    torch = _torch()
    config = transformers.T5Config(d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4, vocab_size=100,
                                   attn_implementation=attn)
    return Embeds.wrap(transformers.T5EncoderModel(config), 16, mask=True), torch.randn(2, 16, 64)


def roberta():
    transformers = _transformers()
    torch = _torch()
    config = transformers.RobertaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                        intermediate_size=128, vocab_size=100, max_position_embeddings=70)
    return Embeds.wrap(transformers.RobertaModel(config, add_pooling_layer=False), 16, mask=True), torch.randn(2, 16, 64)


def decoder(family: str, attn="sdpa"):
    """A Llama-style decoder (RMSNorm, rotary embeddings, SwiGLU, grouped-query attention with a
    causal mask; Qwen2 adds biases to q, k and v), no KV cache."""
    transformers = _transformers()
    torch = _torch()
    config_cls, model_cls = {"llama": (transformers.LlamaConfig, transformers.LlamaModel),
                             "qwen2": (transformers.Qwen2Config, transformers.Qwen2Model),
                             "mistral": (transformers.MistralConfig, transformers.MistralModel)}[family]
    config = config_cls(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, vocab_size=100, max_position_embeddings=64, use_cache=False,
                        attn_implementation=attn)
    return Embeds.wrap(model_cls(config), 16, mask=False), torch.randn(2, 16, 64)


def vit():
    transformers = _transformers()
    torch = _torch()
    config = transformers.ViTConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                    intermediate_size=128, image_size=32, patch_size=8)
    return pixels(transformers.ViTModel(config, add_pooling_layer=False)), torch.randn(2, 3, 32, 32)


def pixels(model):
    """A Hugging Face vision model taking ``pixel_values``, returning its last hidden state."""
    torch = _torch()

    class Wrapped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, x):
            return self.model(pixel_values=x).last_hidden_state

    return Wrapped().eval()


def whisper_encoder():
    transformers = _transformers()
    torch = _torch()
    config = transformers.WhisperConfig(d_model=64, encoder_layers=2, encoder_attention_heads=4,
                                        encoder_ffn_dim=128, num_mel_bins=16, max_source_positions=32,
                                        decoder_layers=1, decoder_attention_heads=4, decoder_ffn_dim=128,
                                        vocab_size=100, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                        decoder_start_token_id=1)
    encoder = transformers.WhisperModel(config).get_encoder().eval()

    class Wrapped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = encoder

        def forward(self, x):
            return self.encoder(input_features=x).last_hidden_state

    return Wrapped().eval(), torch.randn(2, 16, 64)


def wav2vec2():
    transformers = _transformers()
    torch = _torch()
    config = transformers.Wav2Vec2Config(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                         intermediate_size=128, conv_dim=(32, 32), conv_stride=(5, 2),
                                         conv_kernel=(10, 3), num_conv_pos_embeddings=16,
                                         num_conv_pos_embedding_groups=4, vocab_size=100)
    model = transformers.Wav2Vec2Model(config).eval()

    class Wrapped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, x):
            return self.model(input_values=x).last_hidden_state

    return Wrapped().eval(), torch.randn(2, 800)


def hf_text(config: str, model: str, mask: bool = True, dim: int = 64, **kwargs):
    """A Hugging Face text model of ``transformers.<config>(**kwargs)``, as ``Embeds.wrap``."""
    def make():
        transformers = _transformers()
        torch = _torch()
        built = getattr(transformers, model)(getattr(transformers, config)(**kwargs))
        return Embeds.wrap(built, 16, mask=mask), torch.randn(2, 16, dim)
    return make


def hf_vision(config: str, model: str, size: int = 32, **kwargs):
    """A Hugging Face vision model of ``transformers.<config>(**kwargs)``: pixels in, its last
    hidden state out."""
    def make():
        transformers = _transformers()
        torch = _torch()
        return pixels(getattr(transformers, model)(getattr(transformers, config)(**kwargs))), torch.randn(2, 3, size, size)
    return make


ENCODER = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
DECODER = dict(ENCODER, vocab_size=100, max_position_embeddings=64, use_cache=False)
# More of what people export (2026-11-28): BERT's relatives, decoders beyond Llama's, vision
# transformers and CNNs from Hugging Face. CLIP's text model takes token ids only (no
# inputs_embeds), so it is not here.
MORE_FAMILIES = {
    "albert": hf_text("AlbertConfig", "AlbertModel", dim=32, embedding_size=32, vocab_size=100,
                      max_position_embeddings=64, **ENCODER),
    "electra": hf_text("ElectraConfig", "ElectraModel", dim=32, embedding_size=32, vocab_size=100,
                       max_position_embeddings=64, **ENCODER),
    "deberta-v2": hf_text("DebertaV2Config", "DebertaV2Model", vocab_size=100, max_position_embeddings=64, **ENCODER),
    "mpnet": hf_text("MPNetConfig", "MPNetModel", vocab_size=100, max_position_embeddings=70, **ENCODER),
    "xlm-roberta": hf_text("XLMRobertaConfig", "XLMRobertaModel", vocab_size=100, max_position_embeddings=70,
                           **ENCODER),
    "mobilebert": hf_text("MobileBertConfig", "MobileBertModel", dim=32, embedding_size=32, intra_bottleneck_size=32,
                          true_hidden_size=32, vocab_size=100, max_position_embeddings=64,
                          **dict(ENCODER, intermediate_size=64)),
    "opt": hf_text("OPTConfig", "OPTModel", mask=False, hidden_size=64, ffn_dim=128, num_hidden_layers=2,
                   num_attention_heads=4, vocab_size=100, max_position_embeddings=64, word_embed_proj_dim=64),
    "gpt-neox": hf_text("GPTNeoXConfig", "GPTNeoXModel", mask=False, **DECODER),      # Pythia
    "phi": hf_text("PhiConfig", "PhiModel", mask=False, **DECODER),
    "gemma": hf_text("GemmaConfig", "GemmaModel", mask=False, head_dim=16, num_key_value_heads=2, **DECODER),
    "falcon": hf_text("FalconConfig", "FalconModel", mask=False, hidden_size=64, num_hidden_layers=2,
                      num_attention_heads=4, vocab_size=100, use_cache=False),     # multi-query attention
    "bloom": hf_text("BloomConfig", "BloomModel", mask=False, hidden_size=64, n_layer=2, n_head=4, vocab_size=100,
                     use_cache=False),                                             # ALiBi
    "gptj": hf_text("GPTJConfig", "GPTJModel", mask=False, n_embd=64, n_layer=2, n_head=4, vocab_size=100,
                    rotary_dim=8, n_positions=64, use_cache=False),
    "gpt-neo": hf_text("GPTNeoConfig", "GPTNeoModel", mask=False, hidden_size=64, num_layers=2, num_heads=4,
                       attention_types=[[["global", "local"], 1]], window_size=8, vocab_size=100,
                       max_position_embeddings=64, use_cache=False),
    "clip-vision": hf_vision("CLIPVisionConfig", "CLIPVisionModel", image_size=32, patch_size=8, **ENCODER),
    "dinov2": hf_vision("Dinov2Config", "Dinov2Model", image_size=32, patch_size=8, mlp_ratio=2,
                        **{k: v for k, v in ENCODER.items() if k != "intermediate_size"}),
    "deit": hf_vision("DeiTConfig", "DeiTModel", image_size=32, patch_size=8, **ENCODER),
    "beit": hf_vision("BeitConfig", "BeitModel", image_size=32, patch_size=8, use_relative_position_bias=True,
                      **ENCODER),
    "swin-hf": hf_vision("SwinConfig", "SwinModel", image_size=32, patch_size=4, embed_dim=16, depths=[2, 2],
                         num_heads=[2, 4], window_size=4),
    "convnext-hf": hf_vision("ConvNextConfig", "ConvNextModel", hidden_sizes=[16, 32], depths=[1, 1], num_stages=2),
    "resnet-hf": hf_vision("ResNetConfig", "ResNetModel", hidden_sizes=[16, 32], depths=[1, 1], embedding_size=16),
    "segformer": hf_vision("SegformerConfig", "SegformerModel", num_encoder_blocks=2, depths=[1, 1],
                           sr_ratios=[2, 1], hidden_sizes=[16, 32], num_attention_heads=[1, 2], patch_sizes=[7, 3],
                           strides=[4, 2], mlp_ratios=[2, 2]),
    "mobilevit": hf_vision("MobileViTConfig", "MobileViTModel", size=64, image_size=64,
                           hidden_sizes=[32, 48, 64], neck_hidden_sizes=[8, 16, 24, 24, 32, 48, 160]),
    "levit": hf_vision("LevitConfig", "LevitModel", size=64, image_size=64),     # BatchNorm1d after linears
    "poolformer": hf_vision("PoolFormerConfig", "PoolFormerModel", hidden_sizes=[16, 32, 48, 64],
                            depths=[1, 1, 1, 1]),
}


FAMILIES = {
    **{name: (lambda name=name: classifier(name)) for name in CLASSIFIERS},
    "gpt2": gpt2,
    "gpt2-eager": lambda: gpt2("eager"),
    "bert-mask": bert,
    "bert-mask-eager": lambda: bert(attn="eager"),
    "distilbert-mask": distilbert,
    "roberta-mask": roberta,
    "llama": lambda: decoder("llama"),          # the TorchScript exporter fails: aten::diff (the causal mask)
    "llama-eager": lambda: decoder("llama", "eager"),
    "qwen2": lambda: decoder("qwen2"),
    "mistral": lambda: decoder("mistral"),
    "t5-encoder-mask": t5_encoder,
    "t5-encoder-mask-eager": lambda: t5_encoder("eager"),  # the dynamo exporter fails on T5's SDPA path
    "vit": vit,
    "whisper-encoder": whisper_encoder,
    "wav2vec2": wav2vec2,
    **MORE_FAMILIES,
}


def export(module, x, dynamo: bool) -> bytes:
    torch = _torch()
    warnings.simplefilter("ignore")
    if dynamo:
        batch = torch.export.Dim("batch", min=1, max=1024)
        with contextlib.redirect_stdout(io.StringIO()):          # its progress lines
            program = torch.onnx.export(module, (x,), dynamo=True, input_names=["x"], dynamic_shapes=({0: batch},))
        return program.model_proto.SerializeToString()
    f = io.BytesIO()
    torch.onnx.export(module, (x,), f, dynamo=False, opset_version=17, input_names=["x"], output_names=["y"],
                      dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}})
    return f.getvalue()


def check(data: bytes, batches=BATCHES, randomize: bool = False) -> str:
    """'imported ...' when every NumPy engine matches ONNX Runtime on the file at each batch; else
    why not. A file whose output is all zeros at its own weights (MobileViT's random
    initialisation) is checked again on seeded random weights, and says so."""
    import onnxruntime as ort
    model = load_onnx(data, randomize_weights=0) if randomize else load_onnx(data)
    session = ort.InferenceSession(model.source, providers=["CPUExecutionProvider"])
    if not randomize and not np.any(session.run(None, {model.input: model.random_input(1, rng=0)})[0]):
        return check(data, batches, randomize=True) + " (its output is all zeros at its own weights: checked on random ones)"
    worst = 0.0
    engines = {name: ENGINES[name](model, max(batches)) for name in OWN}
    for batch in batches:
        x = model.random_input(batch, rng=100 + batch)
        expected = session.run(None, {model.input: x})[0]
        bar = float(np.abs(expected).max()) or 1.0       # random-init MobileNetV3's logits are ~1e-9
        for name in OWN:
            got = engines[name].forward(x)
            err = float(np.abs(got - expected).max()) / bar
            worst = max(worst, err)
            if not err <= RTOL:
                return f"wrong: {name} at batch {batch}, {err:.1e} relative"
    kinds = sorted({op.kind for op in model.ops})
    peak = max(_warm_peak(ENGINES[name](model, 3), model.random_input(3, rng=0)) for name in OWN[1:])
    arena = ", ".join(f"b{b} {_arena_ratio(model, b):.3f}x" for b in (1, 8))
    return (f"imported: {len(model.ops)} IR ops ({', '.join(kinds)}); worst {worst:.1e} relative; "
            f"a warm forward of the planned engines traced at most {peak} B; arena / lower bound: {arena}")


def _arena_ratio(model, batch: int) -> float:
    report = ENGINES["arena"](model, batch).report()
    return report["arena_bytes"] / report["lower_bound_bytes"]


def _warm_peak(engine, x) -> int:
    """tracemalloc's peak over three warm forwards (Python objects included: a few hundred bytes)."""
    import tracemalloc
    for _ in range(2):
        engine.forward(x)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for _ in range(3):
            engine.forward(x)
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", help="a family (repeatable)")
    parser.add_argument("--keep", type=Path, help="write the exported files into this folder")
    parser.add_argument("--files", type=Path, help="check the files of this folder (FAMILY-EXPORTER.onnx), "
                        "as --keep wrote them, instead of exporting")
    parser.add_argument("--batches", default=",".join(map(str, BATCHES)), help="checked batches, e.g. 1,2")
    args = parser.parse_args(argv)
    batches = tuple(int(b) for b in args.batches.split(","))
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    print(f"torch exports, both exporters; checked on {cpu}\n")
    print("| family | exporter | nodes | result |\n|---|---|---|---|")
    for family in args.only or FAMILIES:
        for dynamo in (False, True):
            exporter = "dynamo" if dynamo else "torchscript"
            if args.files:
                path = args.files / f"{family}-{exporter}.onnx"
                if not path.exists():
                    print(f"| {family} | {exporter} | - | no {path.name} in {args.files} |", flush=True)
                    continue
            try:
                if args.files:
                    data = path.read_bytes()
                else:
                    module, x = FAMILIES[family]()
                    data = export(module, x, dynamo)
            except Exception as exc:           # the exporter's own failure, reported as such
                text = " ".join(str(exc).split())
                cause = text[text.find("<class"):][:200] if "<class" in text else text[:200]
                print(f"| {family} | {exporter} | - | export fails: {type(exc).__name__}: {cause} |", flush=True)
                continue
            if args.keep:
                args.keep.mkdir(parents=True, exist_ok=True)
                (args.keep / f"{family}-{exporter}.onnx").write_bytes(data)
            import onnx
            nodes = len(onnx.load_from_string(data).graph.node)
            try:
                result = check(data, batches)
            except OnnxImportError as exc:
                result = f"refused: {str(exc)[:400]}"
            except Exception as exc:
                result = f"crash: {type(exc).__name__}: {exc} {traceback.format_exc().splitlines()[-3]}"
            print(f"| {family} | {exporter} | {nodes} | {result.replace('|', '/')} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
