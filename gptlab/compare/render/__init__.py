"""The only room that makes words: verdict words, terminal / Markdown / HTML reports, plots, W&B and its workspace."""
