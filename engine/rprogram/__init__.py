"""engine.rprogram"""
