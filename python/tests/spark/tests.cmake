# python/tests/spark: the Spark layer on a real Spark standalone cluster on this machine (a master
# and two workers the test session starts and stops; conftest.py): conflux.spark.run at 2 and 4
# ranks against a local reference, a rank that raises, a lost executor, start_timeout;
# TorchDistributor with the backend "conflux" on the cluster and in local mode; the JVM trainer
# (examples/spark, built by java/CMakeLists.txt) at 2 and 4 tasks through spark-submit. One pytest
# session, so one cluster (starting one costs about 10-20 s). Included by python/CMakeLists.txt
# inside if(BUILD_TESTING), where ${_cfx_py_env} and ${Python3_EXECUTABLE} (the venv's) are set.
execute_process(COMMAND ${Python3_EXECUTABLE} -c "import pyspark"
                RESULT_VARIABLE _spark_rc OUTPUT_QUIET ERROR_QUIET)
if(NOT _spark_rc EQUAL 0)
  message(STATUS "python/tests/spark: skipped (${Python3_EXECUTABLE} does not import pyspark)")
  return()
endif()
# Spark runs on a JDK 17: Debian's (FindJava takes /usr/bin/java; never the Temurin 25 beside it).
find_package(Java 17 COMPONENTS Runtime QUIET)
if(NOT Java_JAVA_EXECUTABLE)
  message(STATUS "python/tests/spark: skipped (no Java 17 runtime; Debian: default-jdk-headless)")
  return()
endif()
file(REAL_PATH ${Java_JAVA_EXECUTABLE} _spark_java)
get_filename_component(_spark_java_home ${_spark_java} DIRECTORY)
get_filename_component(_spark_java_home ${_spark_java_home} DIRECTORY)
if(CONFLUX_WITH_JAVA STREQUAL "OFF")
  message(STATUS "python/tests/spark: the JVM trainer's scenarios skip (CONFLUX_WITH_JAVA=OFF)")
endif()

add_test(NAME python_spark
         COMMAND ${Python3_EXECUTABLE} -m pytest -q -p no:cacheprovider --color=no --timeout=400
                 --timeout-method=thread -rfEs --tb=short ${CMAKE_CURRENT_SOURCE_DIR}/tests/spark)
set_tests_properties(python_spark PROPERTIES LABELS "spark;python;java" TIMEOUT 900 PROCESSORS 2
  RESOURCE_LOCK spark_cluster
  ENVIRONMENT "${_cfx_py_env};JAVA_HOME=${_spark_java_home};OMP_NUM_THREADS=1;CFX_SPARK_TMP=${CMAKE_CURRENT_BINARY_DIR}/spark-tests;CFX_SPARK_CONFLUX_JAR=${CMAKE_BINARY_DIR}/java/conflux.jar;CFX_SPARK_TRAINER_JAR=${CMAKE_BINARY_DIR}/java/conflux_spark_examples.jar;CFX_SPARK_NATIVE_LIBS=$<TARGET_SONAME_FILE:conflux>:${CMAKE_BINARY_DIR}/java/libconflux_jni.so")
