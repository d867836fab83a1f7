"""The fleet's separately deployable services. Each imports `protocol`, never another service."""
