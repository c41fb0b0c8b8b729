"""Using a trained model: a run's model and preprocessing rebuilt from its record, run on new
inputs (images, .npz, token files, WebDataset shards, a saved Hugging Face data set)."""
