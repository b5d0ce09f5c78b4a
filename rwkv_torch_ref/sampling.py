"""Batched sampling in torch: the math of ``rwkv7_core.sampling`` (the numpy reference, which
documents every step). uint32 hashing is done in int64 with explicit 32-bit wrapping."""
from __future__ import annotations

import torch

from rwkv7_core.sampling import GOLDEN, HASH_M1, HASH_M2, NONFINITE_TOKEN, TOP_LOGPROBS, SamplingRows, TokenLogprobs

MASK32 = 0xFFFFFFFF


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2**32 for int64 x in [0, 2**32), without int64 overflow."""
    return (x * (c & 0xFFFF) + (((x * (c >> 16)) & 0xFFFF) << 16)) & MASK32


def lowbias32(x: torch.Tensor) -> torch.Tensor:
    """The uint32 hash on int64 tensors holding values in [0, 2**32)."""
    x = x ^ (x >> 16)
    x = _mul32(x, HASH_M1)
    x = x ^ (x >> 15)
    x = _mul32(x, HASH_M2)
    return x ^ (x >> 16)


def gumbel_noise(seed: torch.Tensor, seed_hi: torch.Tensor, position: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """float32 [B, V] Gumbel noise from seeds (uint32 low and high words [B]) and positions [B]."""
    seed, seed_hi, position = seed.to(torch.int64), seed_hi.to(torch.int64), position.to(torch.int64)
    key = (seed + lowbias32((position + 1) & MASK32)) & MASK32
    key = lowbias32(key ^ lowbias32(seed_hi))
    token_hash = lowbias32(torch.arange(vocab_size, dtype=torch.int64, device=seed.device) + GOLDEN)
    bits = lowbias32(key[:, None] ^ token_hash[None, :])
    u = ((bits >> 8).to(torch.float32) + 0.5) * 2.0 ** -24
    return -torch.log(-torch.log(u))


def nucleus_mask(z: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """bool [B, V]: tokens kept by top-k (0 = off) then top-p on scaled logits z [B, V]."""
    sorted_z = torch.sort(z, dim=1, descending=True).values
    rank = torch.arange(z.shape[1], device=z.device)[None, :]
    sorted_z = torch.where((top_k[:, None] > 0) & (rank >= top_k[:, None]), -torch.inf, sorted_z)
    p = torch.exp(sorted_z - sorted_z[:, :1])
    p = p / p.sum(dim=1, keepdim=True)
    keep = (((torch.cumsum(p, dim=1) - p) < top_p[:, None]) | (top_p[:, None] >= 1)) & (sorted_z > -torch.inf)
    last = (keep.sum(dim=1) - 1).clamp(min=0)  # a NaN row keeps nothing: clamp
    threshold = torch.gather(sorted_z, 1, last[:, None])
    return z >= threshold


def sample_rows(logits: torch.Tensor, counts: torch.Tensor, rows: SamplingRows, banned: torch.Tensor,
                positions: torch.Tensor) -> torch.Tensor:
    """int32 [B] tokens from float32 logits [B, V]; NONFINITE_TOKEN for non-finite rows."""
    logits = logits.float()
    x = logits - rows.presence[:, None] * (counts > 0) - rows.frequency[:, None] * counts
    x = torch.where(banned, -torch.inf, x)
    tokens = torch.argmax(x, dim=1)
    sampled = rows.temperature > 0
    if bool(sampled.any()):
        temperature = torch.where(sampled, rows.temperature, torch.ones_like(rows.temperature))
        z = x / temperature[:, None]
        keep = nucleus_mask(z, rows.top_k, rows.top_p)
        noisy = torch.where(keep, z + gumbel_noise(rows.seed, rows.seed_hi, positions, x.shape[1]), -torch.inf)
        tokens = torch.where(sampled, torch.argmax(noisy, dim=1), tokens)
    finite = torch.isfinite(logits).all(dim=1)
    return torch.where(finite, tokens, torch.full_like(tokens, NONFINITE_TOKEN)).to(torch.int32)


def disallowed(banned: torch.Tensor, allowed: torch.Tensor | None) -> torch.Tensor:
    """bool [B, V]: the banned tokens [B, V] plus those the packed masks ``allowed`` int32 [B, W]
    (rwkv7_core/token_mask.py; None = all allowed) leave out."""
    if allowed is None:
        return banned
    B, V = banned.shape
    bits = (allowed[:, :, None] >> torch.arange(32, device=banned.device, dtype=allowed.dtype)) & 1
    return banned | (bits.reshape(B, -1)[:, :V] == 0)


def update_counts(counts: torch.Tensor, tokens: torch.Tensor, decay: torch.Tensor) -> torch.Tensor:
    """Penalty counts [B, V] after emitting tokens [B]: counts * decay + onehot(tokens)."""
    counts = counts * decay[:, None]
    counts[torch.arange(tokens.shape[0], device=counts.device), tokens.long()] += 1.0
    return counts


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, k: int = TOP_LOGPROBS) -> TokenLogprobs:
    """TokenLogprobs (numpy) of tokens [N] (negative ids score as 0) under float32 logits
    [N, V]; a stable sort puts the lower id first on ties."""
    lp = torch.log_softmax(logits.float(), dim=-1)
    chosen = torch.gather(lp, 1, tokens.long().clamp(min=0)[:, None])[:, 0]
    top_lp, top_ids = torch.sort(lp, dim=1, descending=True, stable=True)
    return TokenLogprobs(chosen.cpu().numpy(), top_ids[:, :k].to(torch.int32).cpu().numpy(),
                         top_lp[:, :k].cpu().numpy())
