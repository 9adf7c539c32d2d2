"""Fine-tune every weight of a ViT-Base-sized plant-disease classifier, with accelerate's
`find_executable_batch_size` to pick the batch, on a machine where the weights fit but the
weights and their gradients do not.

The encoder is ViT-Base's size (12 pre-norm transformer layers of width 768 over 16 x 16
patches: 85 million weights, 326 MiB in float32), built here with random weights where a
real run would load pre-trained ones, with a 38-disease head; leaf photos are 64 x 64, so
an image is 17 tokens and a batch of 16 needs a few MiB of activations. The finder starts
at a batch of 16 and shrinks it by a tenth each time the training function runs out of
memory. But it is the gradients that do not fit: backward gives every weight a gradient,
326 MiB more, and with the weights that is over the 640 MiB there is, whatever the batch.
Every size, 16, 14, 12, 10, 9 and on down to 1, runs out in its first backward pass,
before AdamW has any state, and the finder gives up at zero ("No executable batch size
found"). (Freeze the patch embedding and the first eleven layers and fine-tune the last
layer, the final norm and the head, 7.1 million weights: their gradients and AdamW's
moments take 82 MiB, and the first size tried, 16, trains under the same cap.)
"""

from __future__ import annotations

import resource

import torch
import torch.nn.functional as F
from accelerate.utils import find_executable_batch_size
from torch import nn

BUDGET_BYTES = 640 << 20  # as on a machine with 640 MiB to spare
SIDE, PATCH, WIDTH, LAYERS, HEADS, DISEASES, STEPS = 64, 16, 768, 12, 12, 38, 20


def cap_address_space(budget_bytes: int) -> None:
    """Allow this process `budget_bytes` more address space, so it fails in seconds."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))


class VisionTransformer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        tokens = (SIDE // PATCH) ** 2 + 1
        self.patches = nn.Conv2d(3, WIDTH, PATCH, stride=PATCH)
        self.cls = nn.Parameter(torch.zeros(1, 1, WIDTH))
        self.position = nn.Parameter(0.02 * torch.randn(1, tokens, WIDTH))
        layer = nn.TransformerEncoderLayer(
            WIDTH,
            HEADS,
            4 * WIDTH,
            dropout=0.0,
            activation="gelu",
            batch_first=True,
            norm_first=True,
        )
        self.encoder = nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, DISEASES)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        tokens = self.patches(images).flatten(2).transpose(1, 2)
        tokens = torch.cat([self.cls.expand(len(images), -1, -1), tokens], dim=1)
        hidden = self.encoder(tokens + self.position)
        return self.head(self.norm(hidden[:, 0]))


def make_leaves(count: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Stands in for leaf photos: each disease leaves spots of its own colour."""
    diseases = torch.randint(DISEASES, (count,), generator=generator)
    images = 0.1 * torch.randn((count, 3, SIDE, SIDE), generator=generator)
    images[:, 1] += 0.5  # green
    spots = torch.rand((count, 1, SIDE, SIDE), generator=generator) < 0.05
    colour = torch.stack([diseases % 3, diseases // 3 % 4, diseases // 12], dim=1).float() / 3
    return images + spots * colour[:, :, None, None], diseases


def main() -> None:
    torch.manual_seed(0)
    torch.ones(1 << 20).sum()  # start the thread pool before the cap: its stacks count
    # oneDNN reports a failed allocation as "could not create a primitive"; the plain kernels
    # raise the allocator's own error, as on a GPU.
    torch.backends.mkldnn.enabled = False
    cap_address_space(BUDGET_BYTES)
    model = VisionTransformer()  # in real life: pre-trained weights loaded here
    weights = sum(p.numel() for p in model.parameters())
    print(f"{weights / 1e6:.0f}M weights, {4 * weights >> 20} MiB, all trainable", flush=True)

    @find_executable_batch_size(starting_batch_size=16)
    def fine_tune(batch_size: int) -> None:
        print(f"trying batch {batch_size}", flush=True)
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-5)
        generator = torch.Generator().manual_seed(1)
        for step in range(1, STEPS + 1):
            images, diseases = make_leaves(batch_size, generator)
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(images), diseases)
            loss.backward()
            optimizer.step()
            if step % 5 == 0:
                print(f"batch {batch_size}, step {step}: loss {loss.item():.3f}", flush=True)

    fine_tune()
    print("fine-tuning finished")


if __name__ == "__main__":
    main()
