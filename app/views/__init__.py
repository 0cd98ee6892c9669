"""Pure view functions: engine values in, DOT text / plotly figures / table rows / Markdown out."""
