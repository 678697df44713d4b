"""Presenting results: text tables now, the HTML report later."""
