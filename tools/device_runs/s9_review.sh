# session 9, run 10: every cuda suite after the review's launch-code change (one shared compiled-entry
# lookup for hot_run / descriptor_record; the TMA entry's allocation reused on a refused record)
. tools/device_runs/tests_cuda.sh
tar czf $OUT/pytest-cuda.tgz -C $OUT $(cd $OUT && ls pytest-cuda-*.txt) && rm $OUT/pytest-cuda-*.txt $OUT/install.log
