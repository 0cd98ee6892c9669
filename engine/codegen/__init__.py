"""engine.codegen"""
