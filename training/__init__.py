"""Code that runs inside a Ray Train job: an FSDP2 fine-tune of a Hugging Face causal LM."""
