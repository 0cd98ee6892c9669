"""engine.bundle"""
