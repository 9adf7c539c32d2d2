"""Pre-train a message-passing graph network on protein fragments and small molecules on
two ranks (torchrun, gloo, CPU), where each rank takes a contiguous half of a dataset that
was built by concatenating the two sources: rank 0 gets all the proteins.

The dataset is `ConcatDataset([proteins, molecules])`, 1024 protein fragments of 128
residues (each residue linked to its 16 nearest neighbours, 2048 edges) followed by 1024
drug-like molecules of 16 to 32 atoms (4 neighbours each, about 100 edges), and the
training script shards it by hand, `Subset(dataset, range(rank * half, (rank + 1) * half))`,
shuffling within each shard. The model (3 message-passing layers of 128, 0.2 million
weights, replicated by DDP) computes a message for every edge from its two ends and their
distance, and a step needs about 20 MiB a protein (autograd's saved activations, a few KiB
an edge a layer, and the messages in flight) and 1 MiB a molecule. A batch is 64 graphs a
rank: on rank 0, 64 proteins (131,072 edges), about 1.4 GiB against 1.25 GiB per rank, so
rank 0 runs out in its first forward pass; rank 1, on molecules only (about 6,000 edges),
needs a few dozen MiB a step and waits for rank 0 in the gradients' all-reduce.
(Interleave the shards, as DistributedSampler does, so each rank's batch holds about 32
proteins, at most 40 in an epoch here, and both ranks train under the same cap, peaking
about 1.1 GiB above what they had mapped when they capped themselves.)
"""

from __future__ import annotations

import resource

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import ConcatDataset, DataLoader, Dataset, Subset

BUDGET_BYTES = 1280 << 20  # per rank: as on a machine with 2.5 GiB to spare for two ranks
PROTEINS, MOLECULES, RESIDUES, PROTEIN_K, MOLECULE_K = 1024, 1024, 128, 16, 4
NODE_TYPES, RBF, HIDDEN, LAYERS, BATCH, EPOCHS = 32, 16, 128, 3, 64, 2


def cap_address_space(budget_bytes: int) -> None:
    """Allow this process `budget_bytes` more address space, so it fails in seconds."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * resource.getpagesize()
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    soft = mapped + budget_bytes
    resource.setrlimit(resource.RLIMIT_AS, (soft if hard < 0 else min(soft, hard), hard))


def knn_graph(coordinates: torch.Tensor, neighbours: int) -> torch.Tensor:
    distances = torch.cdist(coordinates, coordinates)
    distances.fill_diagonal_(float("inf"))
    nearest = distances.topk(neighbours, largest=False).indices
    source = torch.arange(len(coordinates)).repeat_interleave(neighbours)
    return torch.stack([source, nearest.flatten()])


class Structures(Dataset):
    """Stands in for structure files: a chain or cloud of typed points in 3D, and a property
    that depends on which types sit close together."""

    def __init__(self, count: int, offset: int, sizes: tuple[int, int], types: range, k: int):
        self.count, self.offset, self.sizes, self.types, self.k = count, offset, sizes, types, k

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        generator = torch.Generator().manual_seed(self.offset + index)
        size = int(torch.randint(self.sizes[0], self.sizes[1] + 1, (), generator=generator))
        steps = torch.randn((size, 3), generator=generator)
        coordinates = torch.cumsum(3.8 * F.normalize(steps, dim=-1), dim=0)
        types = torch.randint(self.types.start, self.types.stop, (size,), generator=generator)
        edges = knn_graph(coordinates, self.k)
        same = (types[edges[0]] % 4 == types[edges[1]] % 4).float().mean()
        return {"types": types, "coordinates": coordinates, "edges": edges, "target": same}


def collate_graphs(graphs: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Pack graphs into one disjoint graph, as graph libraries do."""
    offsets = torch.cumsum(torch.tensor([0] + [len(g["types"]) for g in graphs]), dim=0)
    return {
        "types": torch.cat([g["types"] for g in graphs]),
        "coordinates": torch.cat([g["coordinates"] for g in graphs]),
        "edges": torch.cat([g["edges"] + offsets[i] for i, g in enumerate(graphs)], dim=1),
        "graph": torch.cat([torch.full((len(g["types"]),), i) for i, g in enumerate(graphs)]),
        "target": torch.stack([g["target"] for g in graphs]),
    }


class MessagePassing(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.message = nn.Sequential(
            nn.Linear(2 * HIDDEN + RBF, HIDDEN), nn.SiLU(), nn.Linear(HIDDEN, HIDDEN)
        )
        self.update = nn.Sequential(nn.Linear(2 * HIDDEN, HIDDEN), nn.SiLU())
        self.norm = nn.LayerNorm(HIDDEN)

    def forward(self, hidden, edges, distances):
        source, target = edges
        messages = self.message(torch.cat([hidden[source], hidden[target], distances], dim=-1))
        incoming = torch.zeros_like(hidden).index_add(0, target, messages)
        return self.norm(hidden + self.update(torch.cat([hidden, incoming], dim=-1)))


class GraphRegressor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(NODE_TYPES, HIDDEN)
        self.layers = nn.ModuleList(MessagePassing() for _ in range(LAYERS))
        self.head = nn.Sequential(nn.Linear(HIDDEN, HIDDEN), nn.SiLU(), nn.Linear(HIDDEN, 1))
        self.register_buffer("centres", torch.linspace(0.0, 12.0, RBF))

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        source, target = batch["edges"]
        lengths = (batch["coordinates"][source] - batch["coordinates"][target]).norm(dim=-1)
        distances = torch.exp(-((lengths[:, None] - self.centres) ** 2))
        hidden = self.embed(batch["types"])
        for layer in self.layers:
            hidden = layer(hidden, batch["edges"], distances)
        graphs = len(batch["target"])
        pooled = torch.zeros(graphs, HIDDEN).index_add(0, batch["graph"], hidden)
        counts = torch.bincount(batch["graph"], minlength=graphs).clamp(min=1)
        return self.head(pooled / counts[:, None]).squeeze(-1)


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    torch.ones(1 << 20).sum()  # start the thread pool before the cap: its stacks count
    # oneDNN reports a failed allocation as "could not create a primitive"; the plain kernels
    # raise the allocator's own error, as on a GPU.
    torch.backends.mkldnn.enabled = False
    cap_address_space(BUDGET_BYTES)
    dataset = ConcatDataset(
        [
            Structures(PROTEINS, 0, (RESIDUES, RESIDUES), range(0, 20), PROTEIN_K),
            Structures(MOLECULES, PROTEINS, (16, 32), range(20, NODE_TYPES), MOLECULE_K),
        ]
    )
    half = len(dataset) // world
    shard = Subset(dataset, range(rank * half, (rank + 1) * half))  # BUG: contiguous halves
    loader = DataLoader(
        shard,
        batch_size=BATCH,
        shuffle=True,
        collate_fn=collate_graphs,
        generator=torch.Generator().manual_seed(rank),
    )
    model = DistributedDataParallel(GraphRegressor())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for epoch in range(EPOCHS):
        for step, batch in enumerate(loader, start=1):
            edges = batch["edges"].shape[1]
            if step == 1:
                print(f"rank {rank}: {len(batch['target'])} graphs, {edges} edges", flush=True)
            loss = F.mse_loss(model(batch), batch["target"])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if rank == 0 and step % 4 == 0:
                print(f"epoch {epoch} step {step}: loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()
    if rank == 0:
        print("training finished")


if __name__ == "__main__":
    main()
