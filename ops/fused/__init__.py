"""Fused ops: one module per fused op (its checks, plan, autograd and custom op), the Triton
source beside it. Each op here does in one pass what PyTorch does in several, moving fewer bytes:

* ``add_layer_norm`` / ``add_rms_norm``: the residual add and the normalization after it;
* ``gated_linear``: a gated MLP's two projections and their gate, ``act(x @ Wg.T) * (x @ Wu.T)``;
* ``rotary_embedding``: rotary position embeddings of q and k (transformers' ``apply_rotary_pos_emb``).
"""
