"""A small module the e2e test completes in."""


def fibonacci(n):
    """Return the n-th Fibonacci number."""
    if n < 2:
        return n
    return fibonacci(n - 1) + fibonacci(n - 2)


def main():
    for i in range(10):
        print(i, fibonacci(i))


if __name__ == "__main__":
