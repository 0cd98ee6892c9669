"""engine.tilegraph"""
