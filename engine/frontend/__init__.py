"""engine.frontend"""
