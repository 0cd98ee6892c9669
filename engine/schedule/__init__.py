"""engine.schedule"""
