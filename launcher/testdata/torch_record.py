# A worker whose entry point torch's @record wraps: the exception that ends
# it goes to TORCHELASTIC_ERROR_FILE, which the launcher reports.
import os
import time

from torch.distributed.elastic.multiprocessing.errors import record


@record
def main():
    if os.environ["LOCAL_RANK"] == "1":
        raise ValueError("rank 1 gives up")
    time.sleep(30)


if __name__ == "__main__":
    main()
