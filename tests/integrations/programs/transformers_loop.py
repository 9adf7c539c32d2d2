"""A tiny random BERT trained through transformers' own callback machinery; `oom` exceeds RAM."""

import json
import resource
import sys

import torch
from transformers import BertConfig, BertForSequenceClassification
from transformers.trainer_callback import CallbackHandler, TrainerControl, TrainerState

from memdoc.integrations.transformers import MemdocCallback

trace, mode, result = sys.argv[1], sys.argv[2], sys.argv[3]
config = BertConfig(
    vocab_size=64,
    hidden_size=16,
    num_hidden_layers=1,
    num_attention_heads=2,
    intermediate_size=32,
    max_position_embeddings=16,
)
model = BertForSequenceClassification(config)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
callback = MemdocCallback(trace)
handler = CallbackHandler([callback], model, None, optimizer, None)
state, control = TrainerState(), TrainerControl()
inputs = torch.randint(0, 64, (4, 8))
labels = torch.tensor([0, 1, 0, 1])

if mode in ("oom", "caught"):
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/statm") as statm:
        size_bytes = int(statm.read().split()[0]) * resource.getpagesize()
    resource.setrlimit(resource.RLIMIT_AS, (size_bytes + 2 * 2**30, hard))


def train():
    handler.on_train_begin(None, state, control)
    for epoch in range(2):
        state.epoch = epoch
        handler.on_epoch_begin(None, state, control)
        for _ in range(3):
            if mode in ("oom", "caught") and state.global_step == 2:
                torch.empty(8 * 2**30, dtype=torch.uint8)  # uncaught: the interpreter ends it
            model(input_ids=inputs, labels=labels).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            state.global_step += 1
            handler.on_step_end(None, state, control)
        with torch.no_grad():
            model(input_ids=inputs)
        handler.on_prediction_step(None, state, control)
        handler.on_evaluate(None, state, control, metrics={})
    handler.on_train_end(None, state, control)


if mode == "caught":
    try:
        train()
    except RuntimeError:
        pass  # caught, and the callback not told: the program goes on and ends
else:
    train()
with open(result, "w") as out:
    json.dump(
        {
            "global_step": state.global_step,
            "diagnosis": callback.diagnosis,
            "summary": callback.summary,
        },
        out,
    )
