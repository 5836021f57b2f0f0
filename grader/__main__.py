from grader.cli import main

if __name__ == "__main__":  # not when a worker process of ours imports it (multiprocessing)
    raise SystemExit(main())
