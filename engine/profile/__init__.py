"""engine.profile"""
