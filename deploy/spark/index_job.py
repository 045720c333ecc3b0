r"""``spark-submit`` entry of the indexer: ``python -m client index ... --spark submit``.

    spark-submit --master k8s://https://<api>:6443 ... deploy/spark/index_job.py \
        --url triton-embeddings.triton-embeddings.svc.cluster.local:8000 \
        --model all-MiniLM-L6-v2 /mnt/corpus/ --out /mnt/out

Takes the ``index`` command's arguments; the master and the executors are spark-submit's
(docs/indexing.md, "On a cluster").
"""

import sys

from client.cli import main

if __name__ == "__main__":
    sys.exit(main(["index", *sys.argv[1:], "--spark", "submit"]))
