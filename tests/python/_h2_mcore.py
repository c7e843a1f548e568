"""The megatron-core job of the tests: a tiny GPTModel (local layer spec, CPU, gloo).

Grouped-query attention with fewer query groups than heads (8 heads in 4 groups, head_dim 8),
a QKV bias, SwiGLU (fused gate/up linear_fc1), RMSNorm, untied output layer.  The reference
layout code below is written independently of ckptfs.megatron (reshapes of the raw local
parameters, Llama names spelt out) so the tests compare two derivations.
"""
from __future__ import annotations

import warnings

import torch

HIDDEN, HEADS, GROUPS, HEAD_DIM, FFN, VOCAB, LAYERS = 64, 8, 4, 8, 96, 128, 2


def config(tp: int, pp: int = 1):
    from megatron.core.transformer.transformer_config import TransformerConfig
    return TransformerConfig(
        pipeline_model_parallel_size=pp, pipeline_dtype=torch.float32,
        num_layers=LAYERS, hidden_size=HIDDEN, num_attention_heads=HEADS,
        num_query_groups=GROUPS, kv_channels=HEAD_DIM, ffn_hidden_size=FFN,
        gated_linear_unit=True, activation_func=torch.nn.functional.silu,
        add_bias_linear=False, add_qkv_bias=True, normalization="RMSNorm",
        use_cpu_initialization=True, params_dtype=torch.float32,
        tensor_model_parallel_size=tp, perform_initialization=True)


def build(tp: int, seed: int, pp: int = 1):
    """(model, config) for TP size tp (and PP size pp) over all ranks; every parameter filled
    from seed."""
    warnings.filterwarnings("ignore")
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    if not ps.model_parallel_is_initialized():
        ps.initialize_model_parallel(tensor_model_parallel_size=tp,
                                     pipeline_model_parallel_size=pp)
    cfg = config(tp, pp)
    torch.manual_seed(seed)
    model = GPTModel(config=cfg,
                     transformer_layer_spec=get_gpt_layer_local_spec(normalization="RMSNorm"),
                     vocab_size=VOCAB, max_sequence_length=32, position_embedding_type="rope",
                     share_embeddings_and_output_weights=False,
                     pre_process=ps.is_pipeline_first_stage(),
                     post_process=ps.is_pipeline_last_stage())
    # Distinct values per TP rank and tensor (a layout that mixes up rows cannot pass);
    # replicated tensors (norms) equal on every rank, as training keeps them.
    tp_rank = ps.get_tensor_model_parallel_rank()
    with torch.no_grad():
        for i, (name, p) in enumerate(sorted(model.named_parameters())):
            sharded = getattr(p, "tensor_model_parallel", False)
            g = torch.Generator().manual_seed(seed * 100000 + i * 100 + (tp_rank if sharded else 99)
                                              + 1000 * ps.get_pipeline_model_parallel_rank())
            p.copy_(torch.randn(p.shape, generator=g))
    return model, cfg


def finish():
    """A barrier before the rank returns: rank 0 hosts the TCP store, and a rank that exits
    while another is still creating megatron's process groups (rendezvous through that
    store) makes the other fail with 'Connection reset by peer'."""
    import torch.distributed as dist
    dist.barrier()


def local_params(model) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()
            if isinstance(v, torch.Tensor) and v.is_floating_point()}


def reference_global(locals_by_rank) -> dict:
    """Llama-named global tensors from the raw local parameters of TP ranks 0..T-1."""
    T = len(locals_by_rank)
    hpg = HEADS // GROUPS
    out = {}
    L = locals_by_rank
    cat0 = lambda k: torch.cat([r[k] for r in L], 0)
    cat1 = lambda k: torch.cat([r[k] for r in L], 1)

    def same(k):
        for r in L[1:]:
            assert torch.equal(r[k], L[0][k]), k
        return L[0][k]
    out["model.embed_tokens.weight"] = cat0("embedding.word_embeddings.weight")
    out["lm_head.weight"] = cat0("output_layer.weight")
    out["model.norm.weight"] = same("decoder.final_layernorm.weight")
    for i in range(LAYERS):
        pre, dst = f"decoder.layers.{i}.", f"model.layers.{i}."
        out[dst + "input_layernorm.weight"] = same(pre + "input_layernorm.weight")
        out[dst + "post_attention_layernorm.weight"] = same(pre + "pre_mlp_layernorm.weight")
        out[dst + "self_attn.o_proj.weight"] = cat1(pre + "self_attention.linear_proj.weight")
        out[dst + "mlp.down_proj.weight"] = cat1(pre + "mlp.linear_fc2.weight")
        for kind in ("weight", "bias"):
            qs, ks, vs = [], [], []
            for r in L:
                w = r[pre + f"self_attention.linear_qkv.{kind}"]
                rest = tuple(w.shape[1:])
                w = w.reshape((GROUPS // T, hpg + 2, HEAD_DIM) + rest)
                qs.append(w[:, :hpg].reshape((-1,) + rest))
                ks.append(w[:, hpg].reshape((-1,) + rest))
                vs.append(w[:, hpg + 1].reshape((-1,) + rest))
            out[dst + f"self_attn.q_proj.{kind}"] = torch.cat(qs)
            out[dst + f"self_attn.k_proj.{kind}"] = torch.cat(ks)
            out[dst + f"self_attn.v_proj.{kind}"] = torch.cat(vs)
        gates, ups = [], []
        for r in L:
            w = r[pre + "mlp.linear_fc1.weight"]
            gates.append(w[: w.shape[0] // 2])
            ups.append(w[w.shape[0] // 2:])
        out[dst + "mlp.gate_proj.weight"] = torch.cat(gates)
        out[dst + "mlp.up_proj.weight"] = torch.cat(ups)
    return out


def reference_local(glob: dict, tp: int, rank: int) -> dict:
    """The raw local parameters TP rank `rank` of `tp` must hold for the global tensors."""
    hpg = HEADS // GROUPS
    ch = lambda t, d: torch.chunk(t, tp, d)[rank]
    out = {"embedding.word_embeddings.weight": ch(glob["model.embed_tokens.weight"], 0),
           "output_layer.weight": ch(glob["lm_head.weight"], 0),
           "decoder.final_layernorm.weight": glob["model.norm.weight"]}
    gl = GROUPS // tp
    for i in range(LAYERS):
        pre, src = f"decoder.layers.{i}.", f"model.layers.{i}."
        out[pre + "input_layernorm.weight"] = glob[src + "input_layernorm.weight"]
        out[pre + "pre_mlp_layernorm.weight"] = glob[src + "post_attention_layernorm.weight"]
        out[pre + "self_attention.linear_proj.weight"] = ch(glob[src + "self_attn.o_proj.weight"], 1)
        out[pre + "mlp.linear_fc2.weight"] = ch(glob[src + "mlp.down_proj.weight"], 1)
        for kind in ("weight", "bias"):
            q = glob[src + f"self_attn.q_proj.{kind}"]
            k = glob[src + f"self_attn.k_proj.{kind}"]
            v = glob[src + f"self_attn.v_proj.{kind}"]
            rows = []
            for g in range(rank * gl, (rank + 1) * gl):
                rows += [q[g * hpg * HEAD_DIM:(g + 1) * hpg * HEAD_DIM],
                         k[g * HEAD_DIM:(g + 1) * HEAD_DIM], v[g * HEAD_DIM:(g + 1) * HEAD_DIM]]
            out[pre + f"self_attention.linear_qkv.{kind}"] = torch.cat(rows)
        out[pre + "mlp.linear_fc1.weight"] = torch.cat(
            [ch(glob[src + "mlp.gate_proj.weight"], 0), ch(glob[src + "mlp.up_proj.weight"], 0)])
    return out


def merge_stages(locals_by_stage) -> dict:
    """One TP rank's raw parameters from its pipeline stages, layers renumbered globally."""
    import re
    out = {}
    per = LAYERS // len(locals_by_stage)
    for s, loc in enumerate(locals_by_stage):
        for k, v in loc.items():
            k = re.sub(r"^decoder\.layers\.(\d+)\.",
                       lambda m: f"decoder.layers.{int(m.group(1)) + s * per}.", k)
            assert k not in out, k
            out[k] = v
    return out


def adam_steps(model, steps: int, seed: int):
    """torch Adam over the model's parameters, stepped with synthetic gradients (equal on the
    TP ranks for replicated parameters, as Megatron's gradient all-reduce makes them)."""
    from megatron.core import parallel_state as ps
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    tp_rank = ps.get_tensor_model_parallel_rank()
    named = sorted(model.named_parameters())
    for s in range(steps):
        for i, (_, p) in enumerate(named):
            sharded = getattr(p, "tensor_model_parallel", False)
            g = torch.Generator().manual_seed(seed * 7919 + s * 1000 + i * 10
                                              + (tp_rank if sharded else 9))
            p.grad = torch.randn(p.shape, generator=g)
        opt.step()
        opt.zero_grad()
    return opt


def optim_locals(model, opt) -> dict:
    """{key: {param name: state tensor}} of this rank's raw optimizer state."""
    out = {}
    for name, p in model.named_parameters():
        for k, v in opt.state.get(p, {}).items():
            out.setdefault(k, {})[name] = v.detach().clone()
    return out
