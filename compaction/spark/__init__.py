"""The only package of the library that imports pyspark: DataFrames in and out."""
