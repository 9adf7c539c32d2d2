"""Fine-tune a small patent-abstract encoder, then embed the whole corpus for near-duplicate
search at a batch picked by accelerate's find_executable_batch_size, without
`torch.no_grad()`: every embedding forward keeps what autograd saves for a backward pass
that never comes, and the finder backs off to a far smaller batch than would fit.

The encoder embeds tokens (a 16,000-word vocabulary, 128 dimensions), runs two
transformer encoder layers (4 heads, feed-forward 512) over abstracts of 128 tokens and
mean-pools them; it first trains for 40 steps at a batch of 32 to predict each abstract's
CPC section (8 classes), which fits with room to spare (2.3 million weights, 9 MiB). Then
`embed_corpus`, wrapped in `find_executable_batch_size(starting_batch_size=4096)`, embeds
all 4096 abstracts with the model in `eval()` but autograd on. Each layer's forward then
keeps its inputs, the queries, keys and values, the attention probabilities (4 x 128 x 128
an abstract), the feed-forward activations and the norms' inputs for backward, about
2 MiB an abstract in all, where under `torch.no_grad()` each intermediate is freed as soon
as the next exists (about 0.5 MiB an abstract at the peak). Against 768 MiB of memory the
forward passes at 4096, 2048, 1024 and 512 run out and are caught, and the finder embeds
the corpus at 256 and finishes; under `torch.no_grad()` the first try that fits is 1024.
(The embeddings themselves are detached and take 2 MiB.)
"""

from __future__ import annotations

import resource

import torch
import torch.nn.functional as F
from accelerate.utils import find_executable_batch_size
from torch import nn

BUDGET_BYTES = 768 << 20  # as on a machine with 768 MiB to spare
VOCAB, SEQ, WIDTH, HEADS, LAYERS, SECTIONS = 16_000, 128, 128, 4, 2, 8
CORPUS, TRAIN_BATCH, TRAIN_STEPS = 4096, 32, 40


def cap_address_space(budget_bytes: int) -> None:
    """Allow this process `budget_bytes` more address space, so it fails in seconds."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))


class PatentEncoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tokens = nn.Embedding(VOCAB, WIDTH)
        self.positions = nn.Embedding(SEQ, WIDTH)
        layer = nn.TransformerEncoderLayer(
            WIDTH, HEADS, dim_feedforward=4 * WIDTH, dropout=0.1, batch_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
        self.section = nn.Linear(WIDTH, SECTIONS)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden = self.tokens(tokens) + self.positions.weight[: tokens.shape[1]]
        return F.normalize(self.encoder(hidden).mean(dim=1), dim=-1)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.section(self.embed(tokens))


def make_abstracts(count: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Stands in for tokenised abstracts: each CPC section favours its own terms."""
    sections = torch.randint(SECTIONS, (count,), generator=generator)
    tokens = torch.randint(1000, VOCAB, (count, SEQ), generator=generator)
    terms = 100 * sections[:, None] + torch.randint(100, (count, SEQ // 4), generator=generator)
    tokens[:, ::4] = terms
    return tokens, sections


def main() -> None:
    torch.manual_seed(0)
    torch.ones(1 << 20).sum()  # start the thread pool before the cap: its stacks count
    # oneDNN reports a failed allocation as "could not create a primitive"; the plain kernels
    # raise the allocator's own error, as on a GPU.
    torch.backends.mkldnn.enabled = False
    cap_address_space(BUDGET_BYTES)
    model = PatentEncoder()
    weights = sum(p.numel() for p in model.parameters())
    print(f"{weights / 1e6:.1f}M weights", flush=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    generator = torch.Generator().manual_seed(1)
    model.train()
    for step in range(1, TRAIN_STEPS + 1):
        tokens, sections = make_abstracts(TRAIN_BATCH, generator)
        loss = F.cross_entropy(model(tokens), sections)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % 10 == 0:
            print(f"step {step}: loss {loss.item():.3f}", flush=True)

    corpus, _ = make_abstracts(CORPUS, torch.Generator().manual_seed(2))
    model.eval()

    @find_executable_batch_size(starting_batch_size=4096)
    def embed_corpus(batch_size: int) -> torch.Tensor:
        print(f"embedding the corpus at batch {batch_size}", flush=True)
        vectors = []
        for start in range(0, CORPUS, batch_size):
            # BUG: autograd is on, so the forward keeps its saved activations until it ends
            vectors.append(model.embed(corpus[start : start + batch_size]).detach())
        return torch.cat(vectors)

    vectors = embed_corpus()
    similarity = vectors[:256] @ vectors.T
    similarity[torch.arange(256), torch.arange(256)] = -1.0
    best = similarity.max(dim=1).values
    print(f"{CORPUS} abstracts embedded; {int((best > 0.95).sum())} of 256 have a near-duplicate")


if __name__ == "__main__":
    main()
