import tensorflow

print(f"run.py ran: tensorflow {tensorflow.__version__}")
