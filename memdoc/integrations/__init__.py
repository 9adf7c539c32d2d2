"""memdoc inside training frameworks: Lightning, Hugging Face Trainer, Keras and Jupyter."""
