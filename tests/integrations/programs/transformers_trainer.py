"""A real `transformers.Trainer` fit on CPU: a tiny random BERT, evaluated every 3 steps."""

import json
import sys

import torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

from memdoc.integrations.transformers import MemdocCallback

trace, output_dir, result = sys.argv[1], sys.argv[2], sys.argv[3]
torch.manual_seed(0)
config = BertConfig(
    vocab_size=64,
    hidden_size=16,
    num_hidden_layers=1,
    num_attention_heads=2,
    intermediate_size=32,
    max_position_embeddings=16,
)
examples = [
    {"input_ids": torch.randint(0, 64, (8,)), "labels": torch.tensor(i % 2)} for i in range(4)
]
callback = MemdocCallback(trace)
trainer = Trainer(
    model=BertForSequenceClassification(config),
    args=TrainingArguments(
        output_dir=output_dir,
        max_steps=6,
        per_device_train_batch_size=2,
        per_device_eval_batch_size=2,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        eval_strategy="steps",
        eval_steps=3,
        logging_steps=1,
        disable_tqdm=True,
    ),
    train_dataset=examples,
    eval_dataset=examples,
    callbacks=[callback],
)
trainer.train()
with open(result, "w") as out:
    json.dump({"global_step": trainer.state.global_step, "diagnosis": callback.diagnosis}, out)
