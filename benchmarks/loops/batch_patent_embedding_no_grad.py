"""Fine-tune a small patent-abstract encoder, then embed the whole corpus for near-duplicate
search at a batch picked by accelerate's find_executable_batch_size, without
`torch.no_grad()`: every embedding forward keeps what autograd saves for a backward pass
that never comes, and the finder backs off to a far smaller batch than would fit.

The encoder embeds tokens (a 16,000-word vocabulary, 128 dimensions), runs two
transformer encoder layers (4 heads, feed-forward 512) over abstracts of 128 tokens and
mean-pools them; it first trains for 20 steps at a batch of 32 to predict each abstract's
CPC section (8 classes), which fits with room to spare (2.5 million weights, 9.4 MiB).
Then `embed_corpus`, wrapped in `find_executable_batch_size(starting_batch_size=1024)`,
embeds all 2048 abstracts (the last 256 of them continuations of the first 256, a tenth
of their words changed) with the model in `eval()` but autograd on. Each layer's forward
then keeps its inputs, the queries, keys and values, the attention probabilities
(4 x 128 x 128 an abstract), the feed-forward activations and the norms' inputs for
backward, about 2 MiB an abstract in all, where under `torch.no_grad()` each intermediate
is freed as soon as the next exists (under 0.9 MiB an abstract at the peak). Against
768 MiB of memory the forward passes at 1024, 921, 828 and on down run out and are
caught, 12 of them, as the finder takes a tenth off the batch each time, and it embeds
the corpus at 286 and finishes; under `torch.no_grad()` the first try, 1024, fits. (The
embeddings themselves are detached and take 1 MiB.)
"""

from __future__ import annotations

import ctypes
import resource

import torch
import torch.nn.functional as F
from accelerate.utils import find_executable_batch_size
from torch import nn

BUDGET_BYTES = 768 << 20  # as on a machine with 768 MiB to spare
VOCAB, SEQ, WIDTH, HEADS, LAYERS, SECTIONS = 16_000, 128, 128, 4, 2, 8
CORPUS, FAMILIES, TRAIN_BATCH, TRAIN_STEPS = 2048, 256, 32, 20


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


def make_corpus(generator: torch.Generator) -> torch.Tensor:
    """The last 256 abstracts are continuations of the first 256: a tenth of the words
    changed."""
    corpus, _ = make_abstracts(CORPUS, generator)
    changed = torch.rand((FAMILIES, SEQ), generator=generator) < 0.1
    rewording = torch.randint(1000, VOCAB, (FAMILIES, SEQ), generator=generator)
    corpus[-FAMILIES:] = torch.where(changed, rewording, corpus[:FAMILIES])
    return corpus


def main() -> None:
    # Allocations of 128 KiB and more get their own mappings, returned when freed, as a
    # device's caching allocator keeps large blocks apart from small ones: otherwise the
    # small tensors left on glibc's heap by each failed try pin the freed activations.
    ctypes.CDLL("libc.so.6").mallopt(-3, 128 << 10)  # M_MMAP_THRESHOLD
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

    corpus = make_corpus(torch.Generator().manual_seed(2))
    model.eval()

    @find_executable_batch_size(starting_batch_size=1024)
    def embed_corpus(batch_size: int) -> torch.Tensor:
        print(f"embedding the corpus at batch {batch_size}", flush=True)
        vectors = []
        for start in range(0, CORPUS, batch_size):
            # BUG: autograd is on, so the forward keeps its saved activations until it ends
            vectors.append(model.embed(corpus[start : start + batch_size]).detach())
        return torch.cat(vectors)

    vectors = embed_corpus()
    similarity = vectors[:FAMILIES] @ vectors.T
    similarity[torch.arange(FAMILIES), torch.arange(FAMILIES)] = -1.0
    found = similarity.argmax(dim=1) == torch.arange(CORPUS - FAMILIES, CORPUS)
    print(f"{CORPUS} abstracts embedded; {int(found.sum())} of {FAMILIES} continuations found")


if __name__ == "__main__":
    main()
