"""Tiny configurations of transformers' architectures for the export sweep (encoders,
decoders, vision, audio, encoder-decoders), random weights. ``models()``: name -> () ->
(module, example inputs, input names)."""
import numpy as np
import torch
import transformers as T

SEQ = 12


class Wrapped(torch.nn.Module):
    def __init__(self, model, output="last_hidden_state", keys=("input_ids", "attention_mask")):
        super().__init__()
        self.model, self.output, self.keys = model, output, keys

    def forward(self, *args):
        out = self.model(**dict(zip(self.keys, args)))
        return getattr(out, self.output) if self.output else out[0]


def eager(cls, config):
    config._attn_implementation = "eager"
    return cls(config)


def ids(vocab=100, batch=2, seq=SEQ):
    rng = np.random.default_rng(0)
    return torch.from_numpy(rng.integers(3, vocab, (batch, seq)).astype(np.int64))


def mask(batch=2, seq=SEQ):
    m = np.ones((batch, seq), np.int64); m[1, seq - 4:] = 0
    return torch.from_numpy(m)


def text(cls, config, with_mask=True, output="last_hidden_state", vocab=100):
    model = eager(cls, config)
    if with_mask:
        return Wrapped(model, output), (ids(vocab), mask()), ["input_ids", "attention_mask"]
    return Wrapped(model, output, ("input_ids",)), (ids(vocab),), ["input_ids"]


def image(cls, config, output="pooler_output", values=None, key="pixel_values"):
    values = torch.randn(2, 3, 32, 32) if values is None else values
    return Wrapped(eager(cls, config), output, (key,)), (values,), [key]


class Unmasked(torch.nn.Module):
    """Embeddings then encoder with no attention mask (Nystromformer's landmark attention cannot take the
    all-ones mask the model builds itself when exported: it adds a (b, 1, 1, seq) mask to (b, h, landmarks, seq))."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        return self.model.encoder(self.model.embeddings(input_ids=input_ids), None).last_hidden_state


def kaiming(made):
    """He-initialised convolutions: with the default 0.02 weights a deep plain CNN's output decays to ~1e-33."""
    with torch.no_grad():
        for layer in made[0].modules():
            if isinstance(layer, torch.nn.Conv2d):
                torch.nn.init.kaiming_normal_(layer.weight, nonlinearity="relu").mul_(1.3)
    return made


def moe(cls, config):
    """Mixture of experts with the batched_mm experts: the default grouped_mm sorts tokens and counts them with
    torch.histc (neither exporter converts it), the eager loop visits only the experts hit (data-dependent)."""
    config._experts_implementation = "batched_mm"
    return text(cls, config)


def seq2seq(cls, config):
    keys = ("input_ids", "attention_mask", "decoder_input_ids")
    return Wrapped(eager(cls, config), "last_hidden_state", keys), (ids(), mask(), ids(seq=5)), list(keys)


def models():
    small = dict(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                 max_position_embeddings=64)
    img = torch.randn(2, 3, 32, 32)
    dec = dict(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
               max_position_embeddings=64, use_cache=False)
    audio = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, conv_dim=(16, 16), conv_stride=(5, 2),
                 conv_kernel=(10, 3), num_conv_pos_embeddings=8, num_conv_pos_embedding_groups=2)
    return {
        "distilbert": lambda: text(T.DistilBertModel, T.DistilBertConfig(vocab_size=100, dim=32, n_layers=2, n_heads=2, hidden_dim=64, max_position_embeddings=64)),
        "roberta": lambda: text(T.RobertaModel, T.RobertaConfig(**small)),
        "albert": lambda: text(T.AlbertModel, T.AlbertConfig(embedding_size=16, **small)),
        "electra": lambda: text(T.ElectraModel, T.ElectraConfig(embedding_size=16, **small)),
        "deberta_v2": lambda: text(T.DebertaV2Model, T.DebertaV2Config(**small, relative_attention=True, pos_att_type=["p2c", "c2p"], max_relative_positions=16, position_buckets=8)),
        "mpnet": lambda: text(T.MPNetModel, T.MPNetConfig(**small)),
        "xlm_roberta_cls": lambda: text(T.XLMRobertaForSequenceClassification, T.XLMRobertaConfig(**small, num_labels=3), output="logits"),
        "bert_qa": lambda: text(T.BertForQuestionAnswering, T.BertConfig(**small), output="start_logits"),
        "gpt_neox": lambda: text(T.GPTNeoXModel, T.GPTNeoXConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, max_position_embeddings=64, rotary_pct=0.5, use_cache=False)),
        "opt": lambda: text(T.OPTModel, T.OPTConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, ffn_dim=64, max_position_embeddings=64, word_embed_proj_dim=32, use_cache=False)),
        "bloom": lambda: text(T.BloomModel, T.BloomConfig(vocab_size=100, hidden_size=32, n_layer=2, n_head=2, use_cache=False)),
        "mistral": lambda: text(T.MistralModel, T.MistralConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, use_cache=False, sliding_window=None)),
        "qwen2": lambda: text(T.Qwen2Model, T.Qwen2Config(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, use_cache=False)),
        "phi": lambda: text(T.PhiModel, T.PhiConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, max_position_embeddings=64, partial_rotary_factor=0.5, use_cache=False)),
        "gemma": lambda: text(T.GemmaModel, T.GemmaConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=64, use_cache=False)),
        "falcon": lambda: text(T.FalconModel, T.FalconConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, use_cache=False)),
        "clip_text": lambda: text(T.CLIPTextModel, T.CLIPTextConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, max_position_embeddings=64), output="pooler_output"),
        "clip_vision": lambda: (Wrapped(eager(T.CLIPVisionModel, T.CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=32, patch_size=8)), "pooler_output", ("pixel_values",)), (img,), ["pixel_values"]),
        "vit_hf": lambda: (Wrapped(eager(T.ViTModel, T.ViTConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=32, patch_size=8)), "last_hidden_state", ("pixel_values",)), (img,), ["pixel_values"]),
        "deit": lambda: (Wrapped(eager(T.DeiTModel, T.DeiTConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=32, patch_size=8)), "last_hidden_state", ("pixel_values",)), (img,), ["pixel_values"]),
        "beit": lambda: (Wrapped(eager(T.BeitModel, T.BeitConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=32, patch_size=8, use_relative_position_bias=True)), "last_hidden_state", ("pixel_values",)), (img,), ["pixel_values"]),
        "convnext_hf": lambda: (Wrapped(eager(T.ConvNextModel, T.ConvNextConfig(hidden_sizes=[8, 16], depths=[1, 1], num_stages=2, image_size=32)), "pooler_output", ("pixel_values",)), (img,), ["pixel_values"]),
        "resnet_hf": lambda: (Wrapped(eager(T.ResNetModel, T.ResNetConfig(hidden_sizes=[8, 16], depths=[1, 1], embedding_size=8, layer_type="bottleneck")), "pooler_output", ("pixel_values",)), (img,), ["pixel_values"]),
        "segformer": lambda: (Wrapped(eager(T.SegformerModel, T.SegformerConfig(num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[8, 16], num_attention_heads=[1, 2], patch_sizes=[7, 3], strides=[4, 2], mlp_ratios=[2, 2])), "last_hidden_state", ("pixel_values",)), (img,), ["pixel_values"]),
        "mobilevit": lambda: (Wrapped(eager(T.MobileViTModel, T.MobileViTConfig(image_size=32, hidden_sizes=[16, 16, 16], neck_hidden_sizes=[8, 8, 16, 16, 16, 16, 32], num_attention_heads=2)), "pooler_output", ("pixel_values",)), (img,), ["pixel_values"]),
        "swin_hf": lambda: (Wrapped(eager(T.SwinModel, T.SwinConfig(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[1, 2], window_size=4)), "last_hidden_state", ("pixel_values",)), (img,), ["pixel_values"]),
        "wav2vec2": lambda: (Wrapped(eager(T.Wav2Vec2Model, T.Wav2Vec2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=8, num_conv_pos_embedding_groups=2, do_stable_layer_norm=False)), "last_hidden_state", ("input_values",)), (torch.randn(2, 400),), ["input_values"]),
        "whisper_enc": lambda: (Wrapped(eager(T.WhisperModel, T.WhisperConfig(d_model=32, encoder_layers=2, encoder_attention_heads=2, decoder_layers=1, decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=8, max_source_positions=16, vocab_size=100)).encoder, "last_hidden_state", ("input_features",)), (torch.randn(2, 8, 32),), ["input_features"]),
        "bart": lambda: (Wrapped(eager(T.BartModel, T.BartConfig(vocab_size=100, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64, use_cache=False)), "last_hidden_state", ("input_ids", "attention_mask", "decoder_input_ids")), (ids(), mask(), ids(seq=5)), ["input_ids", "attention_mask", "decoder_input_ids"]),
        "bert_mlm": lambda: text(T.BertForMaskedLM, T.BertConfig(**small), output="logits"),
        "gpt2_lm": lambda: text(T.GPT2LMHeadModel, T.GPT2Config(vocab_size=100, n_embd=32, n_layer=2, n_head=2, n_positions=64, use_cache=False), output="logits"),
        "llama_lm": lambda: text(T.LlamaForCausalLM, T.LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, use_cache=False, tie_word_embeddings=True), output="logits"),
        "squeezebert": lambda: text(T.SqueezeBertModel, T.SqueezeBertConfig(**small, embedding_size=32, q_groups=2, k_groups=2, v_groups=2, post_attention_groups=2, intermediate_groups=2, output_groups=2)),
        "convbert": lambda: text(T.ConvBertModel, T.ConvBertConfig(**small, embedding_size=32, conv_kernel_size=3, head_ratio=2)),
        "funnel": lambda: text(T.FunnelBaseModel, T.FunnelConfig(vocab_size=100, d_model=32, n_head=2, d_head=16, d_inner=64, block_sizes=[1, 1], num_decoder_layers=1)),
        "mobilebert": lambda: text(T.MobileBertModel, T.MobileBertConfig(vocab_size=100, hidden_size=32, embedding_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32, intra_bottleneck_size=16, true_hidden_size=16, num_feedforward_networks=2, max_position_embeddings=64)),
        "dinov2": lambda: (Wrapped(eager(T.Dinov2Model, T.Dinov2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=32, patch_size=8)), "pooler_output", ("pixel_values",)), (img,), ["pixel_values"]),
        "yolos": lambda: (Wrapped(eager(T.YolosModel, T.YolosConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=[32, 32], patch_size=8, num_detection_tokens=5)), "last_hidden_state", ("pixel_values",)), (img,), ["pixel_values"]),
        "levit": lambda: (Wrapped(eager(T.LevitModel, T.LevitConfig(image_size=32, hidden_sizes=[32, 48], num_attention_heads=[2, 3], depths=[1, 1], key_dim=[8, 8], drop_path_rate=0, mlp_ratio=[2, 2], attention_ratio=[2, 2], down_ops=[["Subsample", 8, 2, 2, 2, 2]])), "pooler_output", ("pixel_values",)), (img,), ["pixel_values"]),
        "poolformer": lambda: (Wrapped(eager(T.PoolFormerModel, T.PoolFormerConfig(hidden_sizes=[8, 16], depths=[1, 1], num_encoder_blocks=2, patch_sizes=[7, 3], strides=[4, 2], padding=[2, 1])), "last_hidden_state", ("pixel_values",)), (img,), ["pixel_values"]),
        "regnet": lambda: (Wrapped(eager(T.RegNetModel, T.RegNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], groups_width=4)), "pooler_output", ("pixel_values",)), (img,), ["pixel_values"]),
        "efficientnet_hf": lambda: (Wrapped(eager(T.EfficientNetModel, T.EfficientNetConfig(image_size=32, width_coefficient=0.25, depth_coefficient=0.25, hidden_dim=320)), "pooler_output", ("pixel_values",)), (img,), ["pixel_values"]),
        "mobilenetv2_hf": lambda: (Wrapped(eager(T.MobileNetV2Model, T.MobileNetV2Config(image_size=32, depth_multiplier=0.25)), "pooler_output", ("pixel_values",)), (img,), ["pixel_values"]),
        "dpt": lambda: (Wrapped(eager(T.DPTForDepthEstimation, T.DPTConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=2, image_size=32, patch_size=8, backbone_out_indices=[0, 1, 2, 3], neck_hidden_sizes=[8, 8, 16, 16], fusion_hidden_size=16, head_in_index=-1)), "predicted_depth", ("pixel_values",)), (img,), ["pixel_values"]),
        "t5_full": lambda: (Wrapped(eager(T.T5Model, T.T5Config(vocab_size=100, d_model=32, d_kv=16, d_ff=64, num_layers=1, num_heads=2, use_cache=False)), "last_hidden_state", ("input_ids", "attention_mask", "decoder_input_ids")), (ids(), mask(), ids(seq=5)), ["input_ids", "attention_mask", "decoder_input_ids"]),
        # Widened sweep: decoders (mixture of experts, state-space / recurrent, rotary variants, MQA, qk-norm, soft-capping)
        "mixtral": lambda: moe(T.MixtralModel, T.MixtralConfig(**dec, num_local_experts=4, num_experts_per_tok=2, sliding_window=None)),
        "qwen2_moe": lambda: moe(T.Qwen2MoeModel, T.Qwen2MoeConfig(**dec, moe_intermediate_size=32, shared_expert_intermediate_size=64, num_experts=4, num_experts_per_tok=2, decoder_sparse_step=1, norm_topk_prob=False)),
        "mamba": lambda: text(T.MambaModel, T.MambaConfig(vocab_size=100, hidden_size=32, state_size=8, num_hidden_layers=2, expand=2, conv_kernel=4, time_step_rank=4, use_cache=False), with_mask=False),
        "rwkv": lambda: text(T.RwkvModel, T.RwkvConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, attention_hidden_size=32, intermediate_size=64, context_length=64, use_cache=False), with_mask=False),
        "gptj": lambda: text(T.GPTJModel, T.GPTJConfig(vocab_size=100, n_embd=32, n_layer=2, n_head=2, n_positions=64, rotary_dim=8, use_cache=False)),
        "gpt_bigcode": lambda: text(T.GPTBigCodeModel, T.GPTBigCodeConfig(vocab_size=100, n_embd=32, n_layer=2, n_head=2, n_positions=64, multi_query=True, use_cache=False)),
        "codegen": lambda: text(T.CodeGenModel, T.CodeGenConfig(vocab_size=100, n_embd=32, n_layer=2, n_head=4, n_positions=64, n_ctx=64, rotary_dim=4, use_cache=False)),
        "phi3": lambda: text(T.Phi3Model, T.Phi3Config(**dec, pad_token_id=0, bos_token_id=1, eos_token_id=2)),
        "qwen3": lambda: text(T.Qwen3Model, T.Qwen3Config(**dec, head_dim=8)),
        "stablelm": lambda: text(T.StableLmModel, T.StableLmConfig(**dec, partial_rotary_factor=0.25, qk_layernorm=True, use_parallel_residual=True)),
        "cohere": lambda: text(T.CohereModel, T.CohereConfig(**dec, use_qk_norm=True, pad_token_id=0, bos_token_id=1, eos_token_id=2)),
        "gemma2_lm": lambda: text(T.Gemma2ForCausalLM, T.Gemma2Config(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=64, sliding_window=4, attn_logit_softcapping=50.0, final_logit_softcapping=30.0, use_cache=False), output="logits"),
        # encoders with unusual attention / mixing
        "xlnet": lambda: text(T.XLNetModel, T.XLNetConfig(vocab_size=100, d_model=32, n_layer=2, n_head=2, d_inner=64, use_mems_eval=False)),
        "canine": lambda: text(T.CanineModel, T.CanineConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, max_position_embeddings=64, num_hash_functions=4, num_hash_buckets=64, downsampling_rate=4, local_transformer_stride=4)),
        "esm": lambda: text(T.EsmModel, T.EsmConfig(vocab_size=33, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, max_position_embeddings=64, position_embedding_type="rotary", pad_token_id=1, mask_token_id=32, token_dropout=True), vocab=33),
        "nystromformer": lambda: (Unmasked(eager(T.NystromformerModel, T.NystromformerConfig(**small, num_landmarks=4, segment_means_seq_len=SEQ, conv_kernel_size=3))), (ids(),), ["input_ids"]),
        "fnet": lambda: text(T.FNetModel, T.FNetConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, intermediate_size=64, max_position_embeddings=64, use_tpu_fourier_optimizations=False), with_mask=False),
        "modernbert": lambda: text(T.ModernBertModel, T.ModernBertConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, max_position_embeddings=64, layer_types=["full_attention", "sliding_attention"], local_attention=4, pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2)),
        "longformer": lambda: text(T.LongformerModel, T.LongformerConfig(**small, attention_window=4)),
        "m2m100": lambda: seq2seq(T.M2M100Model, T.M2M100Config(vocab_size=100, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64, use_cache=False, pad_token_id=1)),
        # vision
        "swinv2": lambda: image(T.Swinv2Model, T.Swinv2Config(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[1, 2], window_size=4), "last_hidden_state"),
        "convnextv2": lambda: image(T.ConvNextV2Model, T.ConvNextV2Config(hidden_sizes=[8, 16], depths=[1, 1], num_stages=2, image_size=32)),
        "focalnet": lambda: image(T.FocalNetModel, T.FocalNetConfig(image_size=32, patch_size=4, embed_dim=16, hidden_sizes=[16, 32], depths=[1, 1], focal_levels=[2, 2], focal_windows=[3, 3], drop_path_rate=0.0)),
        "cvt": lambda: image(T.CvtModel, T.CvtConfig(patch_sizes=[7], patch_stride=[4], patch_padding=[2], embed_dim=[16], num_heads=[2], depth=[1], mlp_ratio=[2.0], attention_drop_rate=[0.0], drop_rate=[0.0], drop_path_rate=[0.0], qkv_bias=[True], cls_token=[True], qkv_projection_method=["dw_bn"], kernel_qkv=[3], padding_kv=[1], stride_kv=[2], padding_q=[1], stride_q=[1]), "last_hidden_state"),
        "pvt_v2": lambda: image(T.PvtV2Model, T.PvtV2Config(image_size=32, num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[8, 16], patch_sizes=[7, 3], strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2]), "last_hidden_state"),
        "mobilenet_v1": lambda: kaiming(image(T.MobileNetV1Model, T.MobileNetV1Config(image_size=32, depth_multiplier=0.25, tf_padding=True))),
        "bit": lambda: image(T.BitModel, T.BitConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="preactivation", global_padding="SAME", num_groups=4)),
        "siglip_vision": lambda: image(T.SiglipVisionModel, T.SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=32, patch_size=8)),
        # audio
        "wavlm": lambda: image(T.WavLMModel, T.WavLMConfig(**audio, num_buckets=16, max_bucket_distance=32), "last_hidden_state", torch.randn(2, 400), "input_values"),
        "sew": lambda: image(T.SEWModel, T.SEWConfig(**audio, squeeze_factor=2), "last_hidden_state", torch.randn(2, 400), "input_values"),
        "ast": lambda: image(T.ASTModel, T.ASTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, patch_size=8, frequency_stride=4, time_stride=4, max_length=24, num_mel_bins=16), "pooler_output", torch.randn(2, 24, 16), "input_values"),
        "encodec": lambda: image(T.EncodecModel, T.EncodecConfig(target_bandwidths=[1.5], sampling_rate=800, hidden_size=16, num_filters=4, upsampling_ratios=[4, 2], num_lstm_layers=1, codebook_size=16, codebook_dim=16, kernel_size=3, last_kernel_size=3, residual_kernel_size=3), "audio_values", torch.randn(2, 1, 64), "input_values"),
        "dac": lambda: image(T.DacModel, T.DacConfig(encoder_hidden_size=4, downsampling_ratios=[2, 2], decoder_hidden_size=16, n_codebooks=2, codebook_size=16, codebook_dim=4), "audio_values", torch.randn(2, 1, 64), "input_values"),
        # time series, latent cross-attention, grouping (gumbel hard assignment)
        "patchtst": lambda: image(T.PatchTSTModel, T.PatchTSTConfig(num_input_channels=2, context_length=32, patch_length=8, patch_stride=4, num_hidden_layers=2, d_model=32, num_attention_heads=2, ffn_dim=64), "last_hidden_state", torch.randn(2, 32, 2), "past_values"),
        "perceiver": lambda: image(T.PerceiverModel, T.PerceiverConfig(num_latents=8, d_latents=32, d_model=16, num_blocks=1, num_self_attends_per_block=2, num_self_attention_heads=2, num_cross_attention_heads=1), "last_hidden_state", torch.randn(2, 12, 16), "inputs"),
        "groupvit_vision": lambda: image(T.GroupViTVisionModel, T.GroupViTVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=3, depths=[1, 1, 1], num_group_tokens=[8, 4, 0], num_output_groups=[8, 4, 4], num_attention_heads=2, image_size=32, patch_size=8), "pooler_output"),
    }
