"""The only room that makes words: words.py (every verdict word), one report document (sections.py, built once in
document.py) that the terminal, Markdown, HTML and W&B writers walk, plots, and the W&B workspace."""
