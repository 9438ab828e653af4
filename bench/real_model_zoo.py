"""The real models of bench/real_models.py: each built from its transformers or torchvision
config class with random weights and fixed seeds (nothing is downloaded), its example inputs,
and the wrapper (one tensor out) that is exported. `model_spec(name)` is the entry point.
"""
from __future__ import annotations

import torch

def _seq(tiny):
    return 32 if tiny else 128


def _text_inputs(batch, seq, vocab, mask_pad, generator, with_mask=True):
    inputs = {"input_ids": torch.randint(0, vocab, (batch, seq), generator=generator)}
    if not with_mask:
        return inputs
    mask = torch.ones(batch, seq, dtype=torch.int64)
    if mask_pad:
        mask[:, seq - mask_pad:] = 0  # the last tokens of every row are padding
    inputs["attention_mask"] = mask
    return inputs


def _hf(config_class, model_class, full, tiny_overrides, *, padded=True, with_mask=True, model_kwargs=None):
    """A transformers model: (make(attn, tiny) -> model, inputs(batch, tiny) -> dict)."""
    def config(attn, tiny):
        kwargs = dict(full)
        if tiny:
            kwargs.update(tiny_overrides)
        cfg = config_class(**kwargs)
        cfg._attn_implementation = attn  # what attn_implementation= sets; settable on every 5.x config
        return cfg

    def make(attn, tiny):
        return _trained_looking(model_class(config(attn, tiny), **(model_kwargs or {})))

    def inputs(batch, tiny, generator):
        seq = _seq(tiny)
        vocab = config("eager", tiny).vocab_size
        return _text_inputs(batch, seq, vocab, seq // 4 if padded else 0, generator, with_mask)
    return make, inputs


def _torchvision(name, tiny_kwargs=None, model_kwargs=None):
    def make(attn, tiny):
        import torchvision
        model = getattr(torchvision.models, name)(weights=None, **{**(model_kwargs or {}),
                                                                   **((tiny_kwargs or {}) if tiny else {})})
        _trained_looking(model)
        _calibrate_batch_norm(model, 64 if tiny else 224)
        return model

    def inputs(batch, tiny, generator):
        size = 64 if tiny else 224
        return {"input": torch.randn(batch, 3, size, size, generator=generator)}
    return make, inputs


def _trained_looking(model):
    """Biases and norm parameters away from their initial values (0 and 1), as a checkpoint
    has them. Left at 0, a bias is `x + 0`, which byoc's FoldConstant removes and torch
    still computes: a benchmark on untrained weights would flatter byoc."""
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() == 1:
                parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.02)
    return model


def _calibrate_batch_norm(model, size):
    """Running statistics from 64 random images (cumulative average), as training leaves
    them: the initial ones (mean 0, var 1) let activations shrink to ~1e-10 in the depthwise
    nets, which fp16 cannot represent. Fewer images (8) left the statistics noisy enough that
    ResNet-50's activations grew through the residual stages, and fp16 alone (torch's) was
    then 3.9e-2 off float32."""
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    for norm in norms:
        norm.reset_running_stats()
        norm.momentum = None
    generator = torch.Generator().manual_seed(2)
    model.train()
    with torch.no_grad():
        for _ in range(8):
            model(torch.randn(8, 3, size, size, generator=generator))
    model.eval()


def _vit():
    from transformers import ViTConfig, ViTModel

    def make(attn, tiny):
        kwargs = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128,
                      image_size=64) if tiny else {}
        cfg = ViTConfig(**kwargs)
        cfg._attn_implementation = attn
        return _trained_looking(ViTModel(cfg, add_pooling_layer=False))

    def inputs(batch, tiny, generator):
        size = 64 if tiny else 224
        return {"pixel_values": torch.randn(batch, 3, size, size, generator=generator)}
    return make, inputs


def model_spec(name):
    """(make(attn, tiny), inputs(batch, tiny, generator), output attribute or None)."""
    import transformers as tf
    tiny_bert = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128)
    if name == "bert_base":
        return (*_hf(tf.BertConfig, tf.BertModel, {}, tiny_bert, model_kwargs={"add_pooling_layer": False}),
                "last_hidden_state")
    if name == "roberta":
        return (*_hf(tf.RobertaConfig, tf.RobertaModel, {}, tiny_bert, model_kwargs={"add_pooling_layer": False}),
                "last_hidden_state")
    if name == "distilbert":
        return (*_hf(tf.DistilBertConfig, tf.DistilBertModel, {}, dict(n_layers=2, dim=64, n_heads=4, hidden_dim=128)),
                "last_hidden_state")
    if name == "gpt2":
        # causal; attention_mask all ones, as a tokenizer gives it for one unpadded row (without
        # it transformers 5's packed-sequence check traces torch.diff, which the TorchScript
        # exporter cannot write)
        return (*_hf(tf.GPT2Config, tf.GPT2Model, {"use_cache": False}, dict(n_layer=2, n_embd=64, n_head=4),
                     padded=False), "last_hidden_state")
    if name == "gpt2_ids":
        # GPT-2 exported with input_ids alone, as `torch.onnx.export(model, (input_ids,))`
        # writes it: the causal mask is built inside the graph from shapes (the TorchScript
        # exporter cannot write transformers 5's packed-sequence check: --exporter auto
        # takes the dynamo exporter)
        return (*_hf(tf.GPT2Config, tf.GPT2Model, {"use_cache": False}, dict(n_layer=2, n_embd=64, n_head=4),
                     padded=False, with_mask=False), "last_hidden_state")
    if name == "t5_encoder":  # t5-small's config: relative position bias, RMS-style norm, no biases
        return (*_hf(tf.T5Config, tf.T5EncoderModel, {"use_cache": False},
                     dict(num_layers=2, d_model=64, d_kv=16, num_heads=4, d_ff=128)), "last_hidden_state")
    if name == "vit_b16":
        return (*_vit(), "last_hidden_state")
    if name == "resnet50":
        # The last BatchNorm of each residual branch starts at zero (torchvision's
        # zero_init_residual, from Goyal et al.'s training recipe; then _trained_looking's
        # noise: gamma ~ 0.02, no zeros for byoc to fold). With gamma = 1
        # the random net is chaotic: rounding grows through 16 residual blocks until torch's
        # own fp16 is 4.3e-2 off float32 (H100, 2026-11-24), and no fp16 build can be checked
        # at 2e-2. Same ops and shapes either way: the timing does not change.
        return (*_torchvision(name, model_kwargs={"zero_init_residual": True}), None)
    if name == "resnext50_32x4d":  # grouped 3x3 convs of 4 channels a group; residual BN as resnet50's
        return (*_torchvision(name, model_kwargs={"zero_init_residual": True}), None)
    if name == "llama":
        # the speed issue's LLaMA-style decoder: TinyLlama-1.1B's widths (grouped-query attention,
        # 32 query and 4 key/value heads, RoPE, RMSNorm, SwiGLU) cut to 8 layers; causal, no padding
        return (*_hf(tf.LlamaConfig, tf.LlamaModel,
                     dict(use_cache=False, hidden_size=2048, num_hidden_layers=8, num_attention_heads=32,
                          num_key_value_heads=4, intermediate_size=5632, vocab_size=32000),
                     dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                          intermediate_size=128, vocab_size=512), padded=False), "last_hidden_state")
    if name in ("mobilenet_v3_large", "efficientnet_b0", "convnext_tiny", "swin_t", "regnet_y_400mf", "regnet_y_800mf"):
        return (*_torchvision(name), None)
    raise ValueError(f"unknown model {name!r}; known: bert_base, roberta, distilbert, gpt2, gpt2_ids, t5_encoder, vit_b16, "
                     f"llama, resnet50, resnext50_32x4d, mobilenet_v3_large, efficientnet_b0, convnext_tiny, swin_t, "
                     f"regnet_y_400mf, regnet_y_800mf")


class Wrapper(torch.nn.Module):
    """Positional tensors in the input order, one tensor out."""

    def __init__(self, model, names, attribute):
        super().__init__()
        self.model, self.names, self.attribute = model, list(names), attribute

    def forward(self, *tensors):
        if self.attribute is None:
            return self.model(*tensors)
        return getattr(self.model(**dict(zip(self.names, tensors))), self.attribute)


# --- steps ---------------------------------------------------------------------------------
