"""engine.ir"""
