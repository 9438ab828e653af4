"""The model corpus: real architectures from the installed transformers, torchvision and
timm classes, built with random weights and fixed seeds (nothing is downloaded), each in a
tiny configuration (CI fixtures, `tests/corpus/make_corpus.py`) and at full size (the GPU
run, `bench/corpus_gpu.py`).

`ARCHITECTURES` maps a name to an Architecture; `make(name, tiny)` builds the model (in
eval mode, inside a wrapper that takes the inputs positionally and returns one tensor) and
its example inputs. Nothing here is written for byoc: the configurations are the classes'
own, shrunk where `tiny` (2 layers, small widths, small images).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

TEXT_BATCH, TEXT_SEQ = 2, 16           # tiny text inputs
FULL_TEXT_BATCH, FULL_TEXT_SEQ = 1, 128
IMAGE_BATCH, FULL_IMAGE_BATCH = 2, 8


@dataclass(frozen=True)
class Architecture:
    name: str
    family: str        # text-encoder, decoder, encoder-of-encoder-decoder, vision, speech, multimodal
    source: str        # transformers, torchvision, timm
    build: Callable    # build(tiny) -> (module, inputs: dict of tensors, output attribute or None)
    # named dims of each input for the exporters that take dynamic axes: input -> {axis: name}
    dynamic_axes: dict = field(default_factory=dict)


class Wrapper(torch.nn.Module):
    """Positional tensors in the inputs' order, one tensor out (the attribute named, else the
    first output), as a user wraps a model for export."""

    def __init__(self, model, names, attribute, keywords):
        super().__init__()
        self.model, self.names, self.attribute, self.keywords = model, list(names), attribute, keywords

    def forward(self, *tensors):
        out = self.model(**dict(zip(self.names, tensors))) if self.keywords else self.model(*tensors)
        if self.attribute is not None:
            return getattr(out, self.attribute) if not isinstance(out, dict) else out[self.attribute]
        if isinstance(out, (tuple, list)):
            return out[0]
        return out


def make(name: str, tiny: bool):
    """(wrapper in eval mode, inputs dict) for one architecture, seeded."""
    arch = ARCHITECTURES[name]
    torch.manual_seed(0)
    model, inputs, attribute = arch.build(tiny)
    _trained_looking(model)
    model.eval()
    # transformers' models take their inputs by name; torchvision's and timm's one image
    wrapper = Wrapper(model, inputs, attribute, keywords=arch.source == "transformers").eval()  # the exporter restores a wrapper's mode
    return wrapper, inputs


# ---- helpers ----------------------------------------------------------------------------

def _generator(seed=1):
    return torch.Generator().manual_seed(seed)


def _trained_looking(model):
    """1-D parameters (biases, norm scales) moved off their initial 0 and 1, as a checkpoint
    has them: a zero bias folds away in byoc and would flatter it."""
    generator = _generator(3)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() == 1:
                parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.02)


def _calibrate_batch_norm(model, size, channels=3):
    """Running statistics from random images, as training leaves them (the initial ones let
    deep nets' activations vanish or explode)."""
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if not norms:
        return model
    for norm in norms:
        norm.reset_running_stats()
        norm.momentum = None
    generator = _generator(2)
    model.train()
    with torch.no_grad():
        for _ in range(4):
            model(torch.randn(8, channels, size, size, generator=generator))
    model.eval()
    return model


def _text(vocab, tiny, *, mask=True, token_types=False, pad=True):
    batch, seq = (TEXT_BATCH, TEXT_SEQ) if tiny else (FULL_TEXT_BATCH, FULL_TEXT_SEQ)
    generator = _generator()
    inputs = {"input_ids": torch.randint(3, vocab, (batch, seq), generator=generator)}
    if mask:
        attention = torch.ones(batch, seq, dtype=torch.int64)
        if pad and batch > 1:
            attention[1:, seq - seq // 4:] = 0  # the later rows end in padding
        inputs["attention_mask"] = attention
    if token_types:
        inputs["token_type_ids"] = torch.zeros(batch, seq, dtype=torch.int64)
    return inputs


def _image(tiny, size_tiny=32, size_full=224, channels=3):
    batch, size = (IMAGE_BATCH, size_tiny) if tiny else (FULL_IMAGE_BATCH, size_full)
    return torch.randn(batch, channels, size, size, generator=_generator())


TEXT_AXES = {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "sequence"},
             "token_type_ids": {0: "batch", 1: "sequence"}}
IMAGE_AXES = {"pixel_values": {0: "batch"}, "input": {0: "batch"}}


def _hf(config_name, model_name, full, tiny_overrides, make_inputs, *, attribute="last_hidden_state",
        model_kwargs=None, submodule=None):
    """A transformers model from its config class (`full`, with `tiny_overrides` when tiny);
    make_inputs(config, tiny) -> its inputs."""
    def build(tiny):
        import transformers
        kwargs = dict(full)
        if tiny:
            kwargs.update(tiny_overrides)
        config = getattr(transformers, config_name)(**kwargs)
        model = getattr(transformers, model_name)(config, **(model_kwargs or {}))
        if submodule:
            model = getattr(model, submodule)
        return model, make_inputs(config, tiny), attribute
    return build


def _hf_text(config_name, model_name, full, tiny_overrides, *, mask=True, token_types=False, pad=True, **kwargs):
    return _hf(config_name, model_name, full, tiny_overrides,
               lambda config, tiny: _text(config.vocab_size, tiny, mask=mask, token_types=token_types, pad=pad),
               **kwargs)


def _hf_vision(config_name, model_name, full, tiny_overrides, **kwargs):
    return _hf(config_name, model_name, full, tiny_overrides,
               lambda config, tiny: {"pixel_values": _image(tiny, config.image_size, config.image_size)}, **kwargs)


def _vision(construct, *, size_tiny=32, size_full=224):
    """A torchvision or timm network: construct(tiny) -> module; input named `input`."""
    def build(tiny):
        model = construct(tiny)
        # at the resolution it runs at: statistics of another one let activations drift
        _calibrate_batch_norm(model, size_tiny if tiny else size_full)
        return model, {"input": _image(tiny, size_tiny, size_full)}, None
    return build


# ---- text encoders ----------------------------------------------------------------------

_TINY_BERTLIKE = dict(vocab_size=512, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=64, max_position_embeddings=64)

_bert = _hf_text("BertConfig", "BertModel", {}, _TINY_BERTLIKE, token_types=True,
                 model_kwargs={"add_pooling_layer": False})
_roberta = _hf_text("RobertaConfig", "RobertaModel", {}, {**_TINY_BERTLIKE, "max_position_embeddings": 66},
                    model_kwargs={"add_pooling_layer": False})
_albert = _hf_text("AlbertConfig", "AlbertModel",  # albert-base's sizes (the class defaults to xxlarge)
                   dict(hidden_size=768, num_attention_heads=12, intermediate_size=3072, embedding_size=128),
                   {**_TINY_BERTLIKE, "embedding_size": 16},
                   model_kwargs={"add_pooling_layer": False})
_electra = _hf_text("ElectraConfig", "ElectraModel", {}, {**_TINY_BERTLIKE, "embedding_size": 16})
_distilbert = _hf_text("DistilBertConfig", "DistilBertModel", {},
                       dict(vocab_size=512, dim=32, n_layers=2, n_heads=2, hidden_dim=64,
                            max_position_embeddings=64))
_deberta_v2 = _hf_text("DebertaV2Config", "DebertaV2Model",
                       dict(relative_attention=True, position_buckets=256, pos_att_type=["p2c", "c2p"],
                            max_relative_positions=-1, norm_rel_ebd="layer_norm", share_att_key=True,
                            hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                            vocab_size=128100),  # deberta-v3-base's sizes
                       {**_TINY_BERTLIKE, "position_buckets": 16})
_mpnet = _hf_text("MPNetConfig", "MPNetModel", {}, {**_TINY_BERTLIKE, "max_position_embeddings": 66},
                  model_kwargs={"add_pooling_layer": False})
_modernbert = _hf_text("ModernBertConfig", "ModernBertModel", {},
                       {**_TINY_BERTLIKE, "global_attn_every_n_layers": 2, "local_attention": 8,
                        "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "cls_token_id": 1,
                        "sep_token_id": 2})

# ---- decoders (one unpadded prompt: input_ids and an all-ones mask, as a tokenizer gives) --

_TINY_DECODER = dict(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=128, max_position_embeddings=64)
_DECODER = dict(mask=True, pad=False)

_gpt2 = _hf_text("GPT2Config", "GPT2Model", {"use_cache": False},
                 dict(vocab_size=512, n_embd=32, n_layer=2, n_head=2, n_positions=64), **_DECODER)
# Full sizes: the small members of each family (the classes default to 7B-20B models), decoders
# of 1-2B cut to 8 layers as in the speed issue's LLaMA-style model.
_gpt_neox = _hf_text("GPTNeoXConfig", "GPTNeoXModel",  # pythia-160m
                     dict(use_cache=False, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                          intermediate_size=3072, vocab_size=50304), _TINY_DECODER, **_DECODER)
_LLAMA_8L = dict(use_cache=False, hidden_size=2048, num_hidden_layers=8, num_attention_heads=32, num_key_value_heads=4,
                 intermediate_size=5632, vocab_size=32000)
_llama = _hf_text("LlamaConfig", "LlamaModel", _LLAMA_8L,  # grouped-query attention
                  {**_TINY_DECODER, "num_key_value_heads": 2}, **_DECODER)
_mistral = _hf_text("MistralConfig", "MistralModel", {**_LLAMA_8L, "num_key_value_heads": 8},
                    {**_TINY_DECODER, "num_key_value_heads": 2, "sliding_window": 8}, **_DECODER)
_qwen2 = _hf_text("Qwen2Config", "Qwen2Model",  # qwen2-1.5b's widths, 8 layers
                  dict(use_cache=False, hidden_size=1536, num_hidden_layers=8, num_attention_heads=12,
                       num_key_value_heads=2, intermediate_size=8960, vocab_size=151936),
                  {**_TINY_DECODER, "num_key_value_heads": 2}, **_DECODER)
_opt = _hf_text("OPTConfig", "OPTModel", {"use_cache": False},
                dict(vocab_size=512, hidden_size=32, num_hidden_layers=2, ffn_dim=64, num_attention_heads=2,
                     max_position_embeddings=64, word_embed_proj_dim=32), **_DECODER)
_phi = _hf_text("PhiConfig", "PhiModel",  # phi-1.5's widths, 8 layers
                dict(use_cache=False, hidden_size=2048, num_hidden_layers=8, num_attention_heads=32,
                     intermediate_size=8192, partial_rotary_factor=0.5),
                {**_TINY_DECODER, "partial_rotary_factor": 0.5}, **_DECODER)
_falcon = _hf_text("FalconConfig", "FalconModel",  # multi-query attention; 8 layers of width 2048
                   dict(use_cache=False, hidden_size=2048, num_hidden_layers=8, num_attention_heads=32,
                        multi_query=True, new_decoder_architecture=False, parallel_attn=True),
                   dict(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        multi_query=True, new_decoder_architecture=False, parallel_attn=True), **_DECODER)
_bloom = _hf_text("BloomConfig", "BloomModel",  # ALiBi; bloom-560m's widths, 8 layers
                  dict(use_cache=False, hidden_size=1024, n_layer=8, n_head=16),
                  dict(vocab_size=512, hidden_size=32, n_layer=2, n_head=2), **_DECODER)

# ---- encoders of encoder-decoder models -------------------------------------------------

_t5_encoder = _hf_text("T5Config", "T5EncoderModel", {"use_cache": False},
                       dict(vocab_size=512, d_model=32, d_kv=16, d_ff=64, num_layers=2, num_heads=2))
_bart_encoder = _hf_text("BartConfig", "BartModel", {},
                         dict(vocab_size=512, d_model=32, encoder_layers=2, decoder_layers=2,
                              encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
                              decoder_ffn_dim=64, max_position_embeddings=64), submodule="encoder")


# ---- speech and multimodal --------------------------------------------------------------

def _whisper_encoder(tiny):
    import transformers
    kwargs = dict(vocab_size=512, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
                  decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=16,
                  max_source_positions=32, max_target_positions=32, pad_token_id=0, bos_token_id=1,
                  eos_token_id=2, decoder_start_token_id=1) if tiny else {}
    config = transformers.WhisperConfig(**kwargs)
    model = transformers.WhisperModel(config).encoder
    batch = TEXT_BATCH if tiny else FULL_TEXT_BATCH
    features = torch.randn(batch, config.num_mel_bins, 2 * config.max_source_positions, generator=_generator())
    return model, {"input_features": features}, "last_hidden_state"


def _wav2vec2(tiny):
    import transformers
    kwargs = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                  conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16,
                  num_conv_pos_embedding_groups=2) if tiny else {}
    model = transformers.Wav2Vec2Model(transformers.Wav2Vec2Config(**kwargs))
    batch, samples = (TEXT_BATCH, 800) if tiny else (FULL_TEXT_BATCH, 16000)
    return model, {"input_values": torch.randn(batch, samples, generator=_generator())}, "last_hidden_state"


def _clip(tiny):
    import transformers
    if tiny:
        config = transformers.CLIPConfig(
            text_config=dict(vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                             num_attention_heads=2, max_position_embeddings=32),
            vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                               image_size=32, patch_size=8),
            projection_dim=16)
    else:
        config = transformers.CLIPConfig()
    model = transformers.CLIPModel(config)
    inputs = _text(config.text_config.vocab_size, tiny)
    positions = config.text_config.max_position_embeddings  # CLIP's text model takes 77 tokens
    inputs = {k: v[:, :positions] for k, v in inputs.items()}
    inputs["pixel_values"] = _image(tiny, config.vision_config.image_size, config.vision_config.image_size)
    return model, inputs, "logits_per_image"


# ---- vision: transformers ---------------------------------------------------------------

_TINY_VIT = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, image_size=32,
                 patch_size=8)
_vit = _hf_vision("ViTConfig", "ViTModel", {}, _TINY_VIT, model_kwargs={"add_pooling_layer": False})
_deit = _hf_vision("DeiTConfig", "DeiTModel", {}, _TINY_VIT, model_kwargs={"add_pooling_layer": False})
_beit = _hf_vision("BeitConfig", "BeitModel", {"use_relative_position_bias": True},
                   _TINY_VIT, model_kwargs={"add_pooling_layer": False})


# ---- vision: torchvision ----------------------------------------------------------------

def _tv_swin(v2):
    def construct(tiny):
        import torchvision.models as tvm
        if not tiny:
            return (tvm.swin_v2_t if v2 else tvm.swin_t)(weights=None)
        from torchvision.models import swin_transformer as swin
        extra = dict(block=swin.SwinTransformerBlockV2, downsample_layer=swin.PatchMergingV2) if v2 else {}
        return tvm.SwinTransformer(patch_size=[4, 4], embed_dim=16, depths=[2, 2], num_heads=[1, 2],
                                   window_size=[4, 4], num_classes=10, **extra)
    return _vision(construct, size_tiny=64)


def _tv_convnext(tiny):
    import torchvision.models as tvm
    if not tiny:
        return tvm.convnext_tiny(weights=None)
    from torchvision.models.convnext import CNBlockConfig
    return tvm.ConvNeXt([CNBlockConfig(16, 32, 1), CNBlockConfig(32, None, 1)], num_classes=10)


def _tv_regnet(tiny):
    import torchvision.models as tvm
    if not tiny:
        return tvm.regnet_y_400mf(weights=None)
    from torchvision.models.regnet import BlockParams
    params = BlockParams.from_init_params(depth=4, w_0=16, w_a=8.0, w_m=2.0, group_width=8, se_ratio=0.25)
    return tvm.RegNet(params, num_classes=10, stem_width=16)


def _tv_efficientnet(tiny):
    import torchvision.models as tvm
    if not tiny:
        return tvm.efficientnet_b0(weights=None)
    from torchvision.models.efficientnet import _efficientnet_conf
    settings, last_channel = _efficientnet_conf("efficientnet_b0", width_mult=0.25, depth_mult=0.25)
    return tvm.EfficientNet(settings, 0.2, last_channel=last_channel, num_classes=10)


def _tv_mobilenet_v3(tiny):
    import torchvision.models as tvm
    if not tiny:
        return tvm.mobilenet_v3_large(weights=None)
    from torchvision.models.mobilenetv3 import _mobilenet_v3_conf
    settings, last_channel = _mobilenet_v3_conf("mobilenet_v3_large", width_mult=0.25)
    return tvm.MobileNetV3(settings, last_channel, num_classes=10)


def _tv_mobilenet_v2(tiny):
    import torchvision.models as tvm
    return tvm.mobilenet_v2(weights=None) if not tiny else tvm.MobileNetV2(width_mult=0.25, num_classes=10)


def _tv_densenet(tiny):
    import torchvision.models as tvm
    if not tiny:
        return tvm.densenet121(weights=None)
    return tvm.DenseNet(growth_rate=8, block_config=(2, 2, 2, 2), num_init_features=16, bn_size=2, num_classes=10)


def _tv_shufflenet(tiny):
    import torchvision.models as tvm
    if not tiny:
        return tvm.shufflenet_v2_x1_0(weights=None)
    return tvm.ShuffleNetV2([2, 2, 2], [8, 16, 32, 64, 128], num_classes=10)


def _tv_resnet(tiny):
    import torchvision.models as tvm
    if not tiny:
        return tvm.resnet50(weights=None, zero_init_residual=True)
    # torchvision's ResNet fixes its widths (64 to 512 per stage); two stages of one
    # bottleneck each are the smallest network the class builds
    from torchvision.models.resnet import Bottleneck, ResNet
    model = ResNet(Bottleneck, [1, 1, 1, 1], num_classes=10, width_per_group=8, zero_init_residual=True)
    model.layer3, model.layer4 = torch.nn.Identity(), torch.nn.Identity()
    model.fc = torch.nn.Linear(512, 10)
    return model


def _tv_vit(tiny):
    import torchvision.models as tvm
    if not tiny:
        return tvm.vit_b_16(weights=None)
    return tvm.VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64,
                                 num_classes=10)


# ---- vision: timm -----------------------------------------------------------------------

def _timm_resnet(tiny):
    import timm
    if not tiny:
        return timm.create_model("resnet50", pretrained=False)
    from timm.models.resnet import Bottleneck, ResNet
    return ResNet(Bottleneck, [1, 1, 1, 1], channels=(8, 16, 32, 64), stem_width=16, num_classes=10)


def _timm_vit(tiny):
    import timm
    if not tiny:
        return timm.create_model("vit_small_patch16_224", pretrained=False)
    from timm.models.vision_transformer import VisionTransformer
    return VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=10)


def _timm_convnext(tiny):
    import timm
    if not tiny:
        return timm.create_model("convnext_tiny", pretrained=False)
    from timm.models.convnext import ConvNeXt
    return ConvNeXt(depths=(1, 1, 1, 1), dims=(8, 16, 32, 64), num_classes=10)


def _timm_mixer(tiny):
    import timm
    if not tiny:
        return timm.create_model("mixer_b16_224", pretrained=False)
    from timm.models.mlp_mixer import MlpMixer
    return MlpMixer(img_size=32, patch_size=8, num_blocks=2, embed_dim=32, num_classes=10)


def _timm_efficientnet(tiny):
    import timm
    if not tiny:
        return timm.create_model("efficientnet_b0", pretrained=False)
    from timm.models.efficientnet import _gen_efficientnet
    return _gen_efficientnet("efficientnet_b0", channel_multiplier=0.25, depth_multiplier=0.25, pretrained=False,
                             num_classes=10)


_ARCHS = [
    Architecture("bert", "text-encoder", "transformers", _bert, TEXT_AXES),
    Architecture("roberta", "text-encoder", "transformers", _roberta, TEXT_AXES),
    Architecture("albert", "text-encoder", "transformers", _albert, TEXT_AXES),
    Architecture("electra", "text-encoder", "transformers", _electra, TEXT_AXES),
    Architecture("distilbert", "text-encoder", "transformers", _distilbert, TEXT_AXES),
    Architecture("deberta_v2", "text-encoder", "transformers", _deberta_v2, TEXT_AXES),
    Architecture("mpnet", "text-encoder", "transformers", _mpnet, TEXT_AXES),
    Architecture("modernbert", "text-encoder", "transformers", _modernbert, TEXT_AXES),
    Architecture("gpt2", "decoder", "transformers", _gpt2, TEXT_AXES),
    Architecture("gpt_neox", "decoder", "transformers", _gpt_neox, TEXT_AXES),
    Architecture("llama", "decoder", "transformers", _llama, TEXT_AXES),
    Architecture("mistral", "decoder", "transformers", _mistral, TEXT_AXES),
    Architecture("qwen2", "decoder", "transformers", _qwen2, TEXT_AXES),
    Architecture("opt", "decoder", "transformers", _opt, TEXT_AXES),
    Architecture("phi", "decoder", "transformers", _phi, TEXT_AXES),
    Architecture("falcon", "decoder", "transformers", _falcon, TEXT_AXES),
    Architecture("bloom", "decoder", "transformers", _bloom, TEXT_AXES),
    Architecture("t5_encoder", "encoder-of-encoder-decoder", "transformers", _t5_encoder, TEXT_AXES),
    Architecture("bart_encoder", "encoder-of-encoder-decoder", "transformers", _bart_encoder, TEXT_AXES),
    Architecture("whisper_encoder", "speech", "transformers", _whisper_encoder, {"input_features": {0: "batch"}}),
    Architecture("wav2vec2", "speech", "transformers", _wav2vec2, {"input_values": {0: "batch"}}),
    Architecture("clip", "multimodal", "transformers", _clip, {**TEXT_AXES, **IMAGE_AXES}),
    Architecture("vit", "vision", "transformers", _vit, IMAGE_AXES),
    Architecture("deit", "vision", "transformers", _deit, IMAGE_AXES),
    Architecture("beit", "vision", "transformers", _beit, IMAGE_AXES),
    Architecture("swin_t", "vision", "torchvision", _tv_swin(False), IMAGE_AXES),
    Architecture("swin_v2_t", "vision", "torchvision", _tv_swin(True), IMAGE_AXES),
    Architecture("convnext_t", "vision", "torchvision", _vision(_tv_convnext), IMAGE_AXES),
    Architecture("regnet_y", "vision", "torchvision", _vision(_tv_regnet), IMAGE_AXES),
    Architecture("efficientnet_b0", "vision", "torchvision", _vision(_tv_efficientnet), IMAGE_AXES),
    Architecture("mobilenet_v3_large", "vision", "torchvision", _vision(_tv_mobilenet_v3), IMAGE_AXES),
    Architecture("mobilenet_v2", "vision", "torchvision", _vision(_tv_mobilenet_v2), IMAGE_AXES),
    Architecture("densenet", "vision", "torchvision", _vision(_tv_densenet), IMAGE_AXES),
    Architecture("shufflenet_v2", "vision", "torchvision", _vision(_tv_shufflenet), IMAGE_AXES),
    Architecture("resnet50", "vision", "torchvision", _vision(_tv_resnet), IMAGE_AXES),
    Architecture("vit_tv", "vision", "torchvision", _vision(_tv_vit), IMAGE_AXES),
    Architecture("timm_resnet", "vision", "timm", _vision(_timm_resnet), IMAGE_AXES),
    Architecture("timm_vit", "vision", "timm", _vision(_timm_vit), IMAGE_AXES),
    Architecture("timm_convnext", "vision", "timm", _vision(_timm_convnext), IMAGE_AXES),
    Architecture("timm_mixer", "vision", "timm", _vision(_timm_mixer), IMAGE_AXES),
    Architecture("timm_efficientnet", "vision", "timm", _vision(_timm_efficientnet), IMAGE_AXES),
]
ARCHITECTURES = {arch.name: arch for arch in _ARCHS}
