"""What the saved manifests say, side by side: comparison rows, terminal tables, markdown, CSV,
JSON and HTML, the regression and accuracy gates, and the roofline.
"""
