/* crc16.h - Redis Cluster key slots. */
#ifndef IDEM_CRC16_H
#define IDEM_CRC16_H

#include <stddef.h>
#include <stdint.h>

#define IDEM__SLOTS 16384u

/* CRC-16/XMODEM (polynomial 0x1021, initial 0) of n bytes. */
uint16_t idem__crc16(const void *p, size_t n);

/* The cluster slot of a Redis key name, hash tags included: if the name
 * has a '{' followed later by a '}' with at least one byte between them,
 * only the bytes between the first '{' and the first '}' after it count. */
unsigned idem__key_slot(const void *key, size_t n);

#endif
