"""tileweave Streamlit workbench: pages (thin), views (pure), state (session), services (engine calls)."""
